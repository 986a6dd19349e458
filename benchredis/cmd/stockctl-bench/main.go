// Command stockctl-bench is stockctl with the Redis peers registered for
// stockctl bench --redis. It is built from the benchredis module so that the
// main module never depends on Redis clients; scripts/bench-redis.sh builds
// and runs it.
package main

import (
	"os"

	"github.com/stockctl/stockctl/benchredis/redispeers"
	"github.com/stockctl/stockctl/cmd/stockctl/cli"
)

func main() {
	redispeers.Register()
	os.Exit(cli.Main(os.Args))
}
