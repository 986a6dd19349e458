package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver, pure Go

	"github.com/stockctl/stockctl/feed"
)

// schema is the consumer's two tables. orders holds each order's latest
// state; revision is the etcd revision of the event that set it, which
// makes the upsert monotonic. feed_cursor holds, per feed scope, the
// revision up to which every event has been applied.
const schema = `
CREATE TABLE IF NOT EXISTS orders (
	order_id    TEXT NOT NULL,
	sku         TEXT NOT NULL,
	state       TEXT NOT NULL,
	qty         INTEGER NOT NULL,
	buyer       TEXT,
	parts       TEXT NOT NULL,
	reservation INTEGER NOT NULL,
	deadline    TEXT,
	created     TEXT NOT NULL,
	revision    INTEGER NOT NULL,
	PRIMARY KEY (sku, order_id) -- an order ID is unique per SKU
);
CREATE TABLE IF NOT EXISTS feed_cursor (
	scope    TEXT PRIMARY KEY,
	revision INTEGER NOT NULL
);`

// upsert writes one event as its order's latest state, unless the row
// already holds a later (or the same) revision: a batch applied twice, or a
// snapshot older than some rows, changes nothing. PostgreSQL accepts this
// statement as it is; MySQL spells it ON DUPLICATE KEY UPDATE (docs/feed.md).
const upsert = `
INSERT INTO orders (order_id, sku, state, qty, buyer, parts, reservation, deadline, created, revision)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (sku, order_id) DO UPDATE SET
	state = excluded.state, revision = excluded.revision
WHERE excluded.revision > orders.revision`

// moveCursor stores the cursor; it never moves it back.
const moveCursor = `
INSERT INTO feed_cursor (scope, revision) VALUES (?, ?)
ON CONFLICT (scope) DO UPDATE SET revision = excluded.revision
WHERE excluded.revision > feed_cursor.revision`

// store is the consumer's database.
type store struct {
	db    *sql.DB
	scope string
	// crashAfter, when positive, is how many rows this process writes
	// before it kills itself mid-transaction (FEEDSQL_CRASH_AFTER).
	crashAfter int
	written    int
}

// openStore opens (creating if needed) the SQLite database at path.
func openStore(ctx context.Context, path, scope string) (*store, error) {
	// WAL: a commit is durable against a killed process once Commit
	// returns; busy_timeout: a reader (the tests) never fails a write.
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=busy_timeout(10000)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	db.SetMaxOpenConns(1) // one writer; SQLite serialises them anyway
	if _, err := db.ExecContext(ctx, schema); err != nil {
		db.Close()
		return nil, fmt.Errorf("create the tables in %s: %w", path, err)
	}
	s := &store{db: db, scope: scope}
	if v := os.Getenv("FEEDSQL_CRASH_AFTER"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			db.Close()
			return nil, fmt.Errorf("FEEDSQL_CRASH_AFTER=%q: want a positive number of rows", v)
		}
		s.crashAfter = n
	}
	return s, nil
}

func (s *store) Close() error { return s.db.Close() }

// cursor is the stored cursor, 0 when nothing was applied yet.
func (s *store) cursor(ctx context.Context) (int64, error) {
	var rev int64
	err := s.db.QueryRowContext(ctx, `SELECT revision FROM feed_cursor WHERE scope = ?`, s.scope).Scan(&rev)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return rev, err
}

// apply writes a batch (or a snapshot) and its cursor in one transaction.
// If it fails, or the process dies before the commit, nothing of the batch
// is kept and the cursor stays where it was: the same events come again.
func (s *store) apply(ctx context.Context, b feed.Batch) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // after a Commit, a no-op
	stmt, err := tx.PrepareContext(ctx, upsert)
	if err != nil {
		return err
	}
	defer stmt.Close()
	for _, e := range b.Events {
		parts, err := json.Marshal(e.Parts)
		if err != nil {
			return err
		}
		if _, err := stmt.ExecContext(ctx, e.Order, e.SKU, string(e.Kind), e.Qty, nullable(e.Buyer), string(parts),
			e.Reservation, nullableTime(e.Deadline), e.Created.UTC().Format(time.RFC3339Nano), e.Revision); err != nil {
			return fmt.Errorf("upsert order %s: %w", e.Order, err)
		}
		s.written++
		if s.crashAfter > 0 && s.written >= s.crashAfter {
			// The fault the tests inject: dead in the middle of a batch,
			// its transaction open.
			if p, err := os.FindProcess(os.Getpid()); err == nil {
				_ = p.Kill() // SIGKILL on Unix
			}
			select {}
		}
	}
	if _, err := tx.ExecContext(ctx, moveCursor, s.scope, b.Cursor); err != nil {
		return fmt.Errorf("store the cursor %d: %w", b.Cursor, err)
	}
	return tx.Commit()
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func nullableTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Format(time.RFC3339Nano)
}
