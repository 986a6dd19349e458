package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	ucli "github.com/urfave/cli/v2"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/internal/etcdcall"
	"github.com/stockctl/stockctl/internal/keys"
)

// clusterSpec is one --cluster NAME=ep1,ep2,...
type clusterSpec struct {
	name      string
	endpoints []string // normalised by readGlobals
}

// clusterFlag is the repeatable --cluster flag (a flag.Value): each value
// is NAME=ep1,ep2,...; the environment variable holds several separated by
// ';'. Names are checked by coordinator.NewClusters.
type clusterFlag struct{ specs []clusterSpec }

func (f *clusterFlag) Set(v string) error {
	for _, one := range strings.Split(v, ";") {
		if one = strings.TrimSpace(one); one == "" {
			continue
		}
		name, eps, ok := strings.Cut(one, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return fmt.Errorf("invalid --cluster %q: want NAME=ep1,ep2,...", one)
		}
		sp := clusterSpec{name: name}
		for _, ep := range strings.Split(eps, ",") {
			if ep = strings.TrimSpace(ep); ep != "" {
				sp.endpoints = append(sp.endpoints, ep)
			}
		}
		if len(sp.endpoints) == 0 {
			return fmt.Errorf("invalid --cluster %q: no endpoint", one)
		}
		f.specs = append(f.specs, sp)
	}
	return nil
}

func (f *clusterFlag) String() string {
	var parts []string
	for _, sp := range f.specs {
		parts = append(parts, sp.name+"="+strings.Join(sp.endpoints, ","))
	}
	return strings.Join(parts, ";")
}

// connectClusters makes the coordinator over --cluster's clusters. Each is
// dialled and checked at once, within --dial-timeout; one that does not
// answer is reported on stderr and left to the coordinator, which serves
// the others and checks it when first needed. A cluster that refuses the
// credentials, or none answering, fails the command.
func connectClusters(ctx context.Context, c *ucli.Context, g *globals, cn *conn, opts []coordinator.Option) error {
	clients := make([]*clientv3.Client, len(g.clusters))
	errs := make([]error, len(g.clusters))
	var wg sync.WaitGroup
	for i, cs := range g.clusters {
		wg.Go(func() { clients[i], errs[i] = dial(ctx, g, cs.endpoints) })
	}
	wg.Wait()
	answered := 0
	cls := make([]coordinator.Cluster, len(g.clusters))
	for i, cs := range g.clusters {
		if errs[i] != nil {
			// Not reachable now: a client that keeps trying, without the
			// check.
			fmt.Fprintf(c.App.ErrWriter, "stockctl: warning: cluster %s: %v; serving the other clusters meanwhile\n", cs.name, errs[i])
			cl, err := clientv3.New(clientv3.Config{Endpoints: cs.endpoints, DialTimeout: g.dialTimeout, TLS: g.tls,
				Username: g.user, Password: g.password, Logger: quietLogger()})
			if err != nil {
				return failed(ctx, "connect to cluster "+cs.name, err)
			}
			clients[i] = cl
		} else {
			answered++
		}
		cn.clients = append(cn.clients, clients[i])
		cls[i] = coordinator.Cluster{Name: cs.name, Client: clients[i]}
	}
	if answered == 0 {
		return failed(ctx, "reach any of the clusters", errs[0])
	}
	coord, err := coordinator.NewClusters(ctx, cls, append(opts, coordinator.WithFleetCheckWait(g.dialTimeout))...)
	if err != nil {
		return failed(ctx, "set up the coordinator", err)
	}
	cn.coord = coord
	cn.client = clients[0]
	for _, cs := range g.clusters {
		cn.endpoints = append(cn.endpoints, cs.endpoints...)
	}
	return nil
}

// clusterNames are the coordinator's clusters, or one "" for one cluster:
// what the commands that cover every cluster go over.
func clusterNames(coord *coordinator.Coordinator) []string {
	if cs := coord.Clusters(); cs != nil {
		return cs
	}
	return []string{""}
}

// clusterCoord is the one-cluster coordinator of name ("" : coord itself).
func clusterCoord(coord *coordinator.Coordinator, name string) *coordinator.Coordinator {
	if name == "" {
		return coord
	}
	return coord.Cluster(name)
}

// globalClusters is the global --cluster flag's value: looked up through
// the context's lineage, since a command may have a --cluster flag of its
// own (init's names the cluster to create a SKU in).
func globalClusters(c *ucli.Context) *clusterFlag {
	for _, cc := range c.Lineage() {
		if cf, ok := cc.Generic("cluster").(*clusterFlag); ok {
			return cf
		}
	}
	return nil
}

// refuseFleetMember refuses a one-cluster command (--endpoints, or the
// embedded etcd) on a cluster of a fleet: it would create SKUs without
// their placement claim and take locks in a cluster other than the one
// the fleet places them in (two holders). The fleet record says so. A
// cluster removed from its fleet is no longer one of its clusters.
func refuseFleetMember(ctx context.Context, g *globals, client *clientv3.Client, endpoints []string) error {
	ks, err := keys.New(g.prefix)
	if err != nil {
		return usageError("invalid --prefix %q: %v", g.prefix, err)
	}
	dctx, cancel := context.WithTimeout(ctx, g.dialTimeout)
	defer cancel()
	resp, err := etcdcall.KV(client).Get(dctx, ks.Fleet())
	if err != nil {
		return failed(ctx, "read the fleet record", err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	var rec struct {
		Cluster  string   `json:"cluster"`
		Clusters []string `json:"clusters"`
		Removed  bool     `json:"removed"`
	}
	_ = json.Unmarshal(resp.Kvs[0].Value, &rec)
	if rec.Removed {
		// Removed from its fleet (remove-cluster): it holds no SKU, and its
		// feed's last events may still be read (orders --all --since REV).
		return nil
	}
	return usageError("etcd at %s is cluster %q of a fleet of clusters %s (prefix %s): give every cluster with --cluster NAME=endpoints, in that order, instead of --endpoints",
		strings.Join(endpoints, ","), rec.Cluster, strings.Join(rec.Clusters, ","), g.prefix)
}

// registerEtcdCollectors registers the etcd members' metrics: of the one
// cluster, or of each cluster, labelled with its name.
func registerEtcdCollectors(reg prometheus.Registerer, cn *conn) {
	names := cn.coord.Clusters()
	if names == nil {
		reg.MustRegister(newEtcdCollector(cn.client, cn.endpoints))
		return
	}
	for _, name := range names {
		cl := cn.coord.Cluster(name).Client()
		prometheus.WrapRegistererWith(prometheus.Labels{"cluster": name}, reg).MustRegister(newEtcdCollector(cl, cl.Endpoints()))
	}
}
