package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"

	ucli "github.com/urfave/cli/v2"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stockctl/stockctl/internal/engines"
	"github.com/stockctl/stockctl/segments"
)

func reclaimCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "reclaim",
		Usage: "give etcd its space back: compact its history, defragment each member, disarm NOSPACE",
		Description: "What an operator runs when etcd is full (alarm NOSPACE: every write refused) or getting there:\n" +
			"1. compacts etcd's history up to the current revision (for the whole etcd, not only the prefix: watches\n" +
			"   behind it start over, and past revisions can no longer be audited); 2. defragments each endpoint\n" +
			"   (a member blocks while it defragments); 3. disarms the NOSPACE alarms. Then `stockctl prune` keeps\n" +
			"   the live data small. If the live data alone is near the quota, nothing but a larger\n" +
			"   --quota-backend-bytes helps. On a cluster with authentication it needs the root user.\n" +
			"   See docs/operations.md.",
		ArgsUsage: " ",
		Action:    reclaimAction,
	}
}

// reclaimView is the result of reclaim: each endpoint before and after.
type reclaimView struct {
	// Compacted is the revision history was compacted to.
	Compacted int64       `json:"compacted"`
	Before    []etcdSpace `json:"before"`
	After     []etcdSpace `json:"after"`
	// Disarmed counts the NOSPACE alarms disarmed.
	Disarmed int `json:"disarmed"`
	// ReserveReleased is the bytes of the space reserve deleted before the
	// compaction (0: there was none), room under the quota for prune;
	// ReserveRestored: the reserve was written again after it, the
	// database having room to spare (segments.RestoreSpaceReserve).
	ReserveReleased int64 `json:"reserveReleased"`
	ReserveRestored bool  `json:"reserveRestored"`
}

func (v reclaimView) table() table {
	var t table
	t.add("COMPACTED", fmt.Sprintf("history up to revision %d", v.Compacted))
	t.add("DISARMED", fmt.Sprintf("%d NOSPACE alarms", v.Disarmed))
	switch {
	case v.ReserveRestored:
		t.add("RESERVE", fmt.Sprintf("space reserve of %s in place (the database has room to spare)", bytesText(segments.SpaceReserveBytes)))
	case v.ReserveReleased > 0:
		t.add("RESERVE", fmt.Sprintf("released %s of space reserve: room for prune; a later reclaim writes it again once there is room", bytesText(v.ReserveReleased)))
	default:
		t.add("RESERVE", "none to release (a reclaim before this one released it)")
	}
	t.header = []string{"ENDPOINT", "BEFORE", "AFTER", "IN USE", "QUOTA", "ALARMS"}
	for i, a := range v.After {
		before := ""
		if i < len(v.Before) {
			before = bytesText(v.Before[i].DBSize)
		}
		quota := "-"
		if a.Quota > 0 {
			quota = bytesText(a.Quota)
		}
		alarms := strings.Join(a.Alarms, ",")
		if a.Error != "" {
			alarms = "unreachable: " + a.Error
		} else if alarms == "" {
			alarms = "none"
		}
		t.rows = append(t.rows, []string{a.Endpoint, before, bytesText(a.DBSize), bytesText(a.DBSizeInUse), quota, alarms})
	}
	return t
}

func reclaimAction(c *ucli.Context) error {
	g, err := readGlobals(c)
	if err != nil {
		return err
	}
	if c.NArg() > 0 {
		return usageError("reclaim takes no arguments, got %q", c.Args().Slice())
	}
	return withConn(c, g, func(ctx context.Context, cn *conn) error {
		v := reclaimView{Before: readSpace(ctx, cn.client, cn.endpoints)}
		// The space reserve goes first, so that the compaction below
		// frees its room too (segments/space.go).
		stock := engines.Of(cn.coord).Stock
		if v.ReserveReleased, err = stock.ReleaseSpaceReserve(ctx); err != nil {
			return failed(ctx, "release the space reserve", err)
		}
		// A read answers under NOSPACE, and names the revision to compact to.
		resp, err := cn.client.Get(ctx, g.prefix, clientv3.WithCountOnly())
		if err != nil {
			return failed(ctx, "read the current revision", err)
		}
		v.Compacted = resp.Header.Revision
		if _, err := cn.client.Compact(ctx, v.Compacted, clientv3.WithCompactPhysical()); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
			return failed(ctx, fmt.Sprintf("compact etcd's history to revision %d", v.Compacted), needsRoot(err))
		}
		for _, ep := range cn.endpoints {
			if _, err := cn.client.Defragment(ctx, ep); err != nil {
				return failed(ctx, "defragment "+ep, needsRoot(err))
			}
		}
		alarms, err := cn.client.AlarmList(ctx)
		if err != nil {
			return failed(ctx, "list etcd's alarms", needsRoot(err))
		}
		for _, a := range alarms.Alarms {
			if a.Alarm != pb.AlarmType_NOSPACE {
				continue
			}
			if _, err := cn.client.AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: a.MemberID, Alarm: a.Alarm}); err != nil {
				return failed(ctx, "disarm the NOSPACE alarm", needsRoot(err))
			}
			v.Disarmed++
		}
		v.After = readSpace(ctx, cn.client, cn.endpoints)
		if roomForReserve(v.After) {
			if _, err := stock.RestoreSpaceReserve(ctx); err != nil {
				return failed(ctx, "restore the space reserve", err)
			}
			v.ReserveRestored = true // written now, or already there
		}
		return show(c, g, v)
	})
}

// roomForReserve reports whether every member, as read after a reclaim,
// has room for the space reserve twice over below reserveLine of its
// quota. A member that does not report its quota (etcd before 3.6) cannot
// tell: the reserve is left out, and the next process's first CreateSKU
// writes it.
func roomForReserve(after []etcdSpace) bool {
	if len(after) == 0 {
		return false
	}
	for _, a := range after {
		if a.Error != "" || a.Quota <= 0 || float64(a.DBSize+2*segments.SpaceReserveBytes) > float64(a.Quota)*reserveLine {
			return false
		}
	}
	return true
}

// reserveLine is the share of its quota under which a database must stay
// with the space reserve twice over for reclaim to write it back: status's
// warning line, so that the reserve never brings on a warning (or the
// space guard's refusals) by itself.
const reserveLine = spaceWarnFraction

// rootHint is why reclaim was refused on a cluster with authentication, and
// what to do: compaction, defragmentation and alarms are the whole cluster's,
// which etcd grants its root user only (docs/operations.md).
const rootHint = "reclaim needs etcd's root user (defragmentation and alarms are cluster-wide: a role limited to " +
	"the prefix cannot): run it as root, with --user root:PASSWORD or a client certificate whose CN is " +
	"root (--cert admin.crt --key admin.key, STOCKCTL_USER unset); see docs/operations.md and docs/deploy.md"

// needsRoot adds rootHint to etcd's "permission denied".
func needsRoot(err error) error {
	if isPermissionDenied(err) {
		return fmt.Errorf("%w: %s", err, rootHint)
	}
	return err
}

func isPermissionDenied(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, rpctypes.ErrPermissionDenied) || errors.Is(err, rpctypes.ErrGRPCPermissionDenied) {
		return true
	}
	if s, ok := status.FromError(err); ok && s.Code() == codes.PermissionDenied {
		return true
	}
	// etcd 3.4 answers a defragment by a non-root user with code Unknown and
	// its auth package's bare "auth: permission denied".
	return strings.Contains(err.Error(), "permission denied")
}
