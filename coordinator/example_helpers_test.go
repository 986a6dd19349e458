package coordinator_test

import (
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func mustClient(eps []string) *clientv3.Client {
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	return c
}

func putOp(k, v string) clientv3.Op { return clientv3.OpPut(k, v) }
