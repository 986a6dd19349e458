package redispeers

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stockctl/stockctl/cmd/stockctl/bench"
)

// dialTimeout bounds reaching the Redis server when the strategies are
// made.
const dialTimeout = 5 * time.Second

// Register makes the Redis strategies available to stockctl bench --redis.
func Register() {
	bench.RegisterRedis(Specs)
	bench.RegisterRedisSale(SaleSpecs)
}

// Specs returns the Redis strategies against the server at addr, after
// checking that it answers.
func Specs(addr string) ([]bench.Spec, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: dialTimeout})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		return nil, fmt.Errorf("reach Redis at %s: %w", addr, err)
	}
	return []bench.Spec{Redsync(addr), Lua(addr)}, nil
}

// clients makes one go-redis client per process, each with a connection per
// buyer of its process (plus a few), so that buyers never queue for a
// connection.
func clients(addr string, p bench.Params) []*redis.Client {
	perProc := make([]int, p.Processes)
	for b := range p.Buyers {
		perProc[p.Process(b)]++
	}
	cs := make([]*redis.Client, p.Processes)
	for i := range cs {
		cs[i] = redis.NewClient(&redis.Options{Addr: addr, DialTimeout: dialTimeout, PoolSize: perProc[i] + 4})
	}
	return cs
}

func closeAll(cs []*redis.Client) error {
	var errs []error
	for _, c := range cs {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// readBooks sums the integer values of the keys matching counters and
// orders into b. The run has ended: nothing writes meanwhile.
func readBooks(ctx context.Context, c *redis.Client, counters, orders string, b *bench.Books) error {
	if err := scanValues(ctx, c, counters, func(k string, n int64) {
		b.Remaining += n
		if n < 0 {
			b.Negative -= n
		}
	}); err != nil {
		return err
	}
	return scanValues(ctx, c, orders, func(k string, n int64) {
		if n < 1 {
			b.Problems = append(b.Problems, fmt.Sprintf("order record %s: bad quantity %d", k, n))
			return
		}
		b.Sold += n
		b.Orders++
	})
}

// scanPage is how many keys one SCAN step asks for.
const scanPage = 1000

// scanValues calls f with every key matching pattern and its integer value.
func scanValues(ctx context.Context, c *redis.Client, pattern string, f func(k string, n int64)) error {
	var cursor uint64
	for {
		ks, next, err := c.Scan(ctx, cursor, pattern, scanPage).Result()
		if err != nil {
			return fmt.Errorf("scan %s: %w", pattern, err)
		}
		if len(ks) > 0 {
			vs, err := c.MGet(ctx, ks...).Result()
			if err != nil {
				return fmt.Errorf("read %s: %w", pattern, err)
			}
			for i, v := range vs {
				s, _ := v.(string)
				n, err := strconv.ParseInt(s, 10, 64)
				if err != nil {
					return fmt.Errorf("key %s: bad value %v", ks[i], v)
				}
				f(ks[i], n)
			}
		}
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}

// deleteMatching deletes every key matching pattern.
func deleteMatching(ctx context.Context, c *redis.Client, pattern string) error {
	var cursor uint64
	for {
		ks, next, err := c.Scan(ctx, cursor, pattern, scanPage).Result()
		if err != nil {
			return fmt.Errorf("scan %s: %w", pattern, err)
		}
		if len(ks) > 0 {
			if err := c.Unlink(ctx, ks...).Err(); err != nil {
				return fmt.Errorf("delete %s: %w", pattern, err)
			}
		}
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}
