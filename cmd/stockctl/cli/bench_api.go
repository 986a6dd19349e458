package cli

import (
	"os"
	"slices"

	ucli "github.com/urfave/cli/v2"

	"github.com/stockctl/stockctl/cmd/stockctl/bench"
)

func benchServeBinFlag() ucli.Flag {
	return &ucli.StringFlag{Name: "serve-bin", EnvVars: []string{"STOCKCTL_BENCH_SERVE_BIN"},
		Usage: "the stockctl executable " + bench.NameStockctlAPI + " runs as `stockctl serve` processes (default: this one)"}
}

// benchServe says how stockctl-api runs its serve processes: this
// executable (or --serve-bin), reaching the bench's etcd as the bench does,
// its TLS files and user passed in the environment rather than on a
// command line that ps shows.
func benchServe(c *ucli.Context) (bench.Serve, error) {
	s := bench.Serve{Binary: c.String("serve-bin")}
	if s.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return s, usageError("cannot find this executable for %s's serve processes (%v): give --serve-bin", bench.NameStockctlAPI, err)
		}
		s.Binary = exe
	} else if _, err := os.Stat(s.Binary); err != nil {
		return s, usageError("invalid --serve-bin: %v", err)
	}
	for _, f := range []struct{ flag, env string }{
		{"cacert", "STOCKCTL_CACERT"}, {"cert", "STOCKCTL_CERT"}, {"key", "STOCKCTL_KEY"}, {"user", "STOCKCTL_USER"},
	} {
		if v := c.String(f.flag); v != "" {
			s.Env = append(s.Env, f.env+"="+v)
		}
	}
	return s, nil
}

// withoutOptIn drops the strategies that run only when named in
// --strategies: stockctl-api starts --processes OS processes per run.
func withoutOptIn(specs []bench.Spec) []bench.Spec {
	return slices.DeleteFunc(specs, func(s bench.Spec) bool { return s.Name == bench.NameStockctlAPI })
}
