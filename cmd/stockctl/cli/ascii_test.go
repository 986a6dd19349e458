package cli

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// Non-ASCII names are refused (exit 2) with a message that quotes them and
// their character as UTF-8; before, "byte 1 ('Ã') is not a letter…".
func TestNonASCIINamesQuotedAsUTF8(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.ok("init", "phone", "--total", "10", "--segments", "1")
	for _, tc := range []struct {
		args        []string
		value, char string
	}{
		{[]string{"status", "téléphone"}, "téléphone", "'é' (U+00E9)"},
		{[]string{"init", "téléphone", "--total", "10", "--segments", "1"}, "téléphone", "'é' (U+00E9)"},
		{[]string{"allocate", "phone", "--order", "commande-é", "--qty", "1"}, "commande-é", "'é' (U+00E9)"},
		{[]string{"allocate", "phone", "--order", "o-1", "--qty", "1", "--buyer", "zoë"}, "zoë", "'ë' (U+00EB)"},
		{[]string{"release", "phone", "--order", "commande-é"}, "commande-é", "'é' (U+00E9)"},
		{[]string{"restock", "phone", "--delivery", "bon-№7", "--qty", "1"}, "bon-№7", "'№' (U+2116)"},
	} {
		r := e.fails(ExitUsage, `"`+tc.value+`"`, tc.args...)
		if !strings.Contains(r.stderr, tc.char) || strings.Contains(r.stderr, "Ã") || !utf8.ValidString(r.stderr) {
			t.Errorf("stockctl %s: stderr %q, want %s quoted as UTF-8", strings.Join(tc.args, " "), r.stderr, tc.char)
		}
	}
	var st statusView
	e.json(&st, "status", "phone")
	if st.Orders != 0 {
		t.Fatalf("%d orders after the refusals", st.Orders)
	}
}
