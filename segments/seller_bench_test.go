package segments

import (
	"fmt"
	"testing"
)

// BenchmarkSellerCreate is what a SKU's first order in a process costs
// before it reads etcd: its seller, with 20 segments. Over 10,000 SKUs in a
// short sale nearly every order is its process's first of its SKU.
//
// Run: go test -run X -bench BenchmarkSellerCreate -benchmem ./segments
func BenchmarkSellerCreate(b *testing.B) {
	e := etcdEngine(b)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		info := &skuInfo{name: fmt.Sprint("bench-", i), segments: 20}
		s, err := e.seller(info)
		if err != nil {
			b.Fatal(err)
		}
		s.release()
	}
}
