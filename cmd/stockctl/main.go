// Command stockctl is the command line of stockctl: distributed locks and
// segmented stock on etcd. See docs/cli.md.
package main

import (
	"os"

	"github.com/stockctl/stockctl/cmd/stockctl/cli"
)

func main() {
	os.Exit(cli.Main(os.Args))
}
