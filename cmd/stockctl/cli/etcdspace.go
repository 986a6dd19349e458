package cli

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcdSpace is one etcd member's database size against its quota, and its
// alarms, as its maintenance Status says (docs/operations.md).
type etcdSpace struct {
	Endpoint string `json:"endpoint"`
	// DBSize is the database file's size; DBSizeInUse what its live data
	// takes (the rest is free pages, given back by a defragmentation).
	DBSize      int64 `json:"dbSize"`
	DBSizeInUse int64 `json:"dbSizeInUse"`
	// Quota is --quota-backend-bytes (0: not reported, etcd before 3.6).
	Quota int64 `json:"quota"`
	// Alarms are the member's raised alarms, e.g. "NOSPACE": with NOSPACE
	// etcd refuses every write.
	Alarms []string `json:"alarms"`
	// Error is why the member could not be asked ("" when it answered).
	Error string `json:"error,omitempty"`
}

// spaceTimeout bounds the Status call to each member: a member that is down
// must not hold up `stockctl status` for long.
const spaceTimeout = 2 * time.Second

// readSpace asks every endpoint for its Status, all at once. A member that
// does not answer gets Error, not a failure: this is diagnostics.
func readSpace(ctx context.Context, client *clientv3.Client, endpoints []string) []etcdSpace {
	out := make([]etcdSpace, len(endpoints))
	var wg sync.WaitGroup
	for i, ep := range endpoints {
		wg.Go(func() {
			s := etcdSpace{Endpoint: ep, Alarms: []string{}}
			sctx, cancel := context.WithTimeout(ctx, spaceTimeout)
			st, err := client.Status(sctx, ep)
			cancel()
			if err != nil {
				s.Error = err.Error()
			} else {
				s.DBSize, s.DBSizeInUse, s.Quota = st.DbSize, st.DbSizeInUse, st.DbSizeQuota
				for _, e := range st.Errors {
					// "memberID:8915101428417018297 alarm:NOSPACE"
					if _, alarm, ok := strings.Cut(e, "alarm:"); ok {
						s.Alarms = append(s.Alarms, strings.TrimSpace(alarm))
					}
				}
			}
			out[i] = s
		})
	}
	wg.Wait()
	return out
}

// spaceWarnFraction is how full a database must be before status warns.
const spaceWarnFraction = 0.8

// warning is what status says about s, or "" when all is well: an alarm,
// or a database over spaceWarnFraction of its quota.
func (s etcdSpace) warning() string {
	switch {
	case s.Error != "":
		return ""
	case len(s.Alarms) > 0:
		return fmt.Sprintf("%s: alarm %s: etcd refuses every write (database %s of a %s quota); run `stockctl reclaim`, "+
			"then `stockctl prune`: see docs/operations.md", s.Endpoint, strings.Join(s.Alarms, ", "), bytesText(s.DBSize), bytesText(s.Quota))
	case s.Quota > 0 && float64(s.DBSize) >= spaceWarnFraction*float64(s.Quota):
		return fmt.Sprintf("%s: database %s of a %s quota (%.0f%%): at the quota etcd refuses every write; "+
			"prune old orders, or compact and defragment: see docs/operations.md", s.Endpoint, bytesText(s.DBSize), bytesText(s.Quota),
			100*float64(s.DBSize)/float64(s.Quota))
	}
	return ""
}

// bytesText is n in KiB, MiB or GiB, to a tenth.
func bytesText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// etcdCollector exports readSpace at scrape time, for serve and rebalance
// --watch: the figures an operator watches to prune before etcd is full.
type etcdCollector struct {
	client    *clientv3.Client
	endpoints []string
	size      *prometheus.Desc
	inUse     *prometheus.Desc
	quota     *prometheus.Desc
	alarm     *prometheus.Desc
	up        *prometheus.Desc
}

func newEtcdCollector(client *clientv3.Client, endpoints []string) *etcdCollector {
	ep := []string{"endpoint"}
	return &etcdCollector{client: client, endpoints: endpoints,
		size:  prometheus.NewDesc("stockctl_etcd_db_size_bytes", "Size of the etcd member's database file, from its Status at scrape time.", ep, nil),
		inUse: prometheus.NewDesc("stockctl_etcd_db_size_in_use_bytes", "Part of the etcd member's database its live data takes (the rest is freed by a defragmentation).", ep, nil),
		quota: prometheus.NewDesc("stockctl_etcd_quota_backend_bytes", "The etcd member's --quota-backend-bytes (0: not reported, etcd before 3.6): at it, etcd raises NOSPACE and refuses every write.", ep, nil),
		alarm: prometheus.NewDesc("stockctl_etcd_alarm", "1 for each alarm the etcd member has raised (NOSPACE: every write refused; CORRUPT).", []string{"endpoint", "alarm"}, nil),
		up:    prometheus.NewDesc("stockctl_etcd_status_up", "1 when the etcd member answered its Status at this scrape, else 0.", ep, nil),
	}
}

func (c *etcdCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.size, c.inUse, c.quota, c.alarm, c.up} {
		ch <- d
	}
}

func (c *etcdCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range readSpace(context.Background(), c.client, c.endpoints) {
		if s.Error != "" {
			ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0, s.Endpoint)
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1, s.Endpoint)
		ch <- prometheus.MustNewConstMetric(c.size, prometheus.GaugeValue, float64(s.DBSize), s.Endpoint)
		ch <- prometheus.MustNewConstMetric(c.inUse, prometheus.GaugeValue, float64(s.DBSizeInUse), s.Endpoint)
		ch <- prometheus.MustNewConstMetric(c.quota, prometheus.GaugeValue, float64(s.Quota), s.Endpoint)
		for _, a := range s.Alarms {
			ch <- prometheus.MustNewConstMetric(c.alarm, prometheus.GaugeValue, 1, s.Endpoint, a)
		}
	}
}
