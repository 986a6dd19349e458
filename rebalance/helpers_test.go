package rebalance_test

import clientv3 "go.etcd.io/etcd/client/v3"

func clientv3WithPrefix() []clientv3.OpOption { return []clientv3.OpOption{clientv3.WithPrefix()} }
