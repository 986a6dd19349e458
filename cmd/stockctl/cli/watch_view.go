package cli

import (
	"fmt"
	"math"
	"strconv"
	"time"
)

// watchView is one frame of status --watch: the -o json contract (one
// object per line) and the table drawn on a terminal or printed as a block.
type watchView struct {
	SKU string `json:"sku"`
	// At is when the frame was made.
	At time.Time `json:"at"`
	// Revision is the etcd revision of the latest change shown.
	Revision  int64 `json:"revision"`
	Total     int64 `json:"total"`
	Pool      int64 `json:"pool"`
	Allocated int64 `json:"allocated"`
	Orders    int64 `json:"orders"`
	// Reserved and Confirmed split Allocated: units in live reservations,
	// and the rest (plain allocations and confirmed reservations). They are
	// nil, absent from the JSON and the table, until the SKU had a
	// reservation since the watch began.
	Reserved          *int64  `json:"reserved,omitempty"`
	Confirmed         *int64  `json:"confirmed,omitempty"`
	OrdersPerSec      float64 `json:"ordersPerSec"`
	RefillsPerSec     float64 `json:"refillsPerSec"`
	RateWindowSeconds float64 `json:"rateWindowSeconds"`
	LowWatermark      int64   `json:"lowWatermark"`
	RefillBatch       int64   `json:"refillBatch"`
	// Leader is the identity of the elected rebalancer and LeaderLease its
	// session's lease in hexadecimal, both "" when none is elected.
	Leader      string `json:"leader"`
	LeaderLease string `json:"leaderLease"`
	// Rebalancer is its last pass, as status shows it (null if none ran).
	Rebalancer *rebalancerView `json:"rebalancer"`
	// PoolHolder is the lease holding the pool's lock, "" when free, and
	// PoolHolderIdentity the holder's identity (its --identity).
	PoolHolder         string             `json:"poolHolder"`
	PoolHolderIdentity string             `json:"poolHolderIdentity"`
	Segments           []watchSegmentView `json:"segments"`
	// Note is present only on a frame that follows a reload or shows a
	// watch being re-established: what happened (a compaction, a lost
	// watch and the error). Such a frame is printed even when nothing
	// else changed.
	Note string `json:"note,omitempty"`

	full int64 // a full segment bar, in units
}

// watchSegmentView is one segment: its stock as status shows it, and who
// holds its lock.
type watchSegmentView struct {
	segmentView
	// Holder is the lease (one per process) holding the segment's lock, in
	// hexadecimal; "" when nobody holds it. Waiting counts the other
	// sessions queued for it.
	Holder string `json:"holder"`
	// HolderIdentity names the holder: its --identity (host/pid by
	// default), from its lock key; "" when free.
	HolderIdentity string `json:"holderIdentity"`
	Waiting        int    `json:"waiting"`
}

// view makes a frame of s at now.
func (s *saleState) view(now time.Time) watchView {
	v := watchView{SKU: s.sku, At: now, Revision: s.rev, Total: s.total, Pool: s.pool, Orders: s.orders - s.claims,
		OrdersPerSec:      round1(s.ordersW.rate(now, s.started)),
		RefillsPerSec:     round1(s.refill.rate(now, s.started)),
		RateWindowSeconds: watchRateWindow.Seconds(),
		LowWatermark:      s.meta.LowWatermark, RefillBatch: s.meta.RefillBatch,
		Segments: make([]watchSegmentView, len(s.counter)), full: s.full}
	remaining := s.pool
	for i := range s.counter {
		lease, waiting := s.holder(i)
		v.Segments[i] = watchSegmentView{segmentView: segmentView{Index: i, Remaining: s.remaining(i), Inbox: s.inbox[i]},
			Holder: leaseHex(lease), HolderIdentity: s.idents[lease], Waiting: waiting}
		remaining += s.remaining(i)
	}
	v.Allocated = s.total - remaining
	if lease, _ := s.holder(-1); lease != 0 {
		v.PoolHolder, v.PoolHolderIdentity = leaseHex(lease), s.idents[lease]
	}
	if l, ok := s.leader(); ok {
		v.Leader, v.LeaderLease = l.identity, leaseHex(l.lease)
	}
	if p := s.pass; p != nil {
		v.Rebalancer = &rebalancerView{Leader: p.Leader, At: p.At, Moves: p.Moves, Moved: p.Moved,
			Revision: p.Revision, TotalMoves: p.TotalMoves, TotalMoved: p.TotalMoved}
	}
	if s.sawReservations {
		// Every unit held by orders is reserved (a live reservation's index
		// key says how many) or confirmed (the rest).
		reserved := s.reserved()
		confirmed := v.Allocated - reserved
		v.Reserved, v.Confirmed = &reserved, &confirmed
	}
	return v
}

// leaseHex spells a lease as sessions do in their keys; "" for none.
func leaseHex(lease int64) string {
	if lease == 0 {
		return ""
	}
	return strconv.FormatInt(lease, 16)
}

// round1 rounds a rate to a tenth, so that frames compare equal when
// what they show is equal.
func round1(x float64) float64 { return math.Round(x*10) / 10 }

func (v watchView) table() table {
	var t table
	t.add("SKU", v.SKU)
	t.add("TOTAL", v.Total)
	t.add("POOL", v.Pool)
	t.add("ALLOCATED", allocatedText(v.Allocated, v.Orders, 0))
	// The frame's height is not fixed anywhere: these lines appear once
	// the figures exist.
	if v.Reserved != nil {
		t.add("RESERVED", *v.Reserved)
	}
	if v.Confirmed != nil {
		t.add("CONFIRMED", *v.Confirmed)
	}
	t.add("RATE", fmt.Sprintf("%.1f orders/s, %.1f refills/s (last %gs)", v.OrdersPerSec, v.RefillsPerSec, v.RateWindowSeconds))
	t.add("POLICY", fmt.Sprintf("refill %d when a segment holds less than %d", v.RefillBatch, v.LowWatermark))
	t.add("REVISION", v.Revision)
	if v.Leader != "" {
		t.add("LEADER", fmt.Sprintf("%s (lease %s)", v.Leader, v.LeaderLease))
	} else {
		t.add("LEADER", "no rebalancer elected")
	}
	if r := v.Rebalancer; r != nil {
		t.add("LAST PASS", fmt.Sprintf("%s by %s: %s (%d units); %s (%d units) since elected",
			r.At.Local().Format(time.TimeOnly), r.Leader, moves(r.Moves), r.Moved, moves(r.TotalMoves), r.TotalMoved))
	} else {
		t.add("LAST PASS", "never ran")
	}
	if v.Note != "" {
		t.add("WATCH", v.Note)
	}
	t.header = []string{"SEGMENT", "REMAINING", "INBOX", "LEVEL", "HOLDER"}
	t.rows = append(t.rows, []string{"pool", fmt.Sprint(v.Pool), "", bar(v.Pool, v.Total), v.holderCell(v.PoolHolder, v.PoolHolderIdentity, 0)})
	for _, s := range v.Segments {
		level := bar(s.Remaining, v.full)
		if s.Remaining < max(v.LowWatermark, 1) {
			level += " low"
		}
		t.rows = append(t.rows, []string{fmt.Sprint(s.Index), fmt.Sprint(s.Remaining), fmt.Sprint(s.Inbox), level,
			v.holderCell(s.Holder, s.HolderIdentity, s.Waiting)})
	}
	// Notes fit in 80 columns: a terminal cuts longer lines.
	t.notes = append(t.notes,
		fmt.Sprintf("(segment bars: full at %d units, the most a segment held since the watch began)", v.full),
		fmt.Sprintf("(pool bar: full at the total, %d units)", v.Total),
		"(HOLDER: the process holding the lock, its --identity and lease; +N waiting)")
	return t
}

// moves counts moves in words: "1 move", "3 moves".
func moves(n int) string {
	if n == 1 {
		return "1 move"
	}
	return fmt.Sprintf("%d moves", n)
}

// holderCell names a lock's holder, by its identity and lease, marking
// the elected rebalancer's lease (it takes segment locks to move stock).
func (v watchView) holderCell(lease, identity string, waiting int) string {
	s := lease
	if identity != "" && lease != "" {
		s = identity + " " + lease
	}
	if lease != "" && lease == v.LeaderLease {
		s += " (rebalancer)"
	}
	if waiting > 0 {
		s += fmt.Sprintf(" +%d", waiting)
	}
	return s
}
