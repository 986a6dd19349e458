package cli

import (
	"strings"
	"testing"
)

// Every error of a stock command says each thing once: one "failed to",
// the SKU once, the order once, what went wrong. (The CLI used to add its
// own "failed to allocate 2000 of iphone for order ..." to the library's
// "allocate iphone order ...: iphone: insufficient stock: ...".)
func TestErrorsSayItOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.ok("init", "phone", "--total", "10", "--segments", "2")
	e.ok("init", "tee", "--total", "10", "--segments", "2", "--per-user-limit", "2")
	e.ok("allocate", "phone", "--order", "o-1", "--qty", "2")
	e.ok("reserve", "tee", "--order", "o-2", "--qty", "2", "--ttl", "1h", "--buyer", "amy")
	e.ok("confirm", "tee", "--order", "o-2")
	for _, tc := range []struct {
		code int
		want string
		args []string
	}{
		{ExitInsufficientStock, `failed to allocate phone order "o-9": insufficient stock: want 2000, have 8 at revision `,
			[]string{"allocate", "phone", "--order", "o-9", "--qty", "2000"}},
		{ExitNotFound, `failed to allocate nope order "o-9": unknown SKU`, []string{"allocate", "nope", "--order", "o-9", "--qty", "1"}},
		{ExitConflict, `failed to allocate phone order "o-1": conflict: the order was already applied with qty 2, not 3`,
			[]string{"allocate", "phone", "--order", "o-1", "--qty", "3"}},
		{ExitConflict, `failed to allocate tee order "o-2": conflict: the order was already applied as a reservation`,
			[]string{"allocate", "tee", "--order", "o-2", "--qty", "2", "--buyer", "amy"}},
		{ExitLimitExceeded, `failed to reserve tee order "o-3": buyer "amy": per-user limit exceeded: holds 2, wants 1 more, limit 2`,
			[]string{"reserve", "tee", "--order", "o-3", "--qty", "1", "--ttl", "1h", "--buyer", "amy"}},
		{ExitConflict, `failed to cancel tee order "o-2": conflict: the reservation was confirmed; a paid order is returned by release`,
			[]string{"cancel", "tee", "--order", "o-2"}},
		{ExitNotFound, `failed to release phone order "o-8": order not found`, []string{"release", "phone", "--order", "o-8"}},
		{ExitNotFound, `failed to confirm phone order "o-8": order not found`, []string{"confirm", "phone", "--order", "o-8"}},
		{ExitConflict, `failed to create phone: conflict: the SKU already exists`, []string{"init", "phone", "--total", "1", "--segments", "1"}},
		{ExitNotFound, `failed to read the status of nope: unknown SKU`, []string{"status", "nope"}},
		{ExitNotFound, `failed to audit nope: unknown SKU`, []string{"audit", "nope"}},
		{ExitNotFound, `failed to restock nope delivery "dv-1": unknown SKU`, []string{"restock", "nope", "--delivery", "dv-1", "--qty", "1"}},
	} {
		r := e.fails(tc.code, tc.want, tc.args...)
		msg := strings.TrimSpace(r.stderr)
		sku, order := tc.args[1], ""
		for i, a := range tc.args {
			if a == "--order" {
				order = `"` + tc.args[i+1] + `"`
			}
		}
		if n := strings.Count(msg, "failed to"); n != 1 {
			t.Errorf("%q says \"failed to\" %d times", msg, n)
		}
		if n := strings.Count(msg, " "+sku+" ") + strings.Count(msg, " "+sku+":"); n != 1 {
			t.Errorf("%q names %s %d times", msg, sku, n)
		}
		if order != "" && strings.Count(msg, order) != 1 {
			t.Errorf("%q names order %s %d times", msg, order, strings.Count(msg, order))
		}
	}
}
