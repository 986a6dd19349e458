package etcdtest

import (
	"net"
	"testing"
)

// FreePorts returns n distinct ports that were free on 127.0.0.1 a moment ago.
//
// All n probe listeners are held open at once so the kernel cannot hand out
// the same port twice within one call; they are closed before returning, so
// another process may still take a port before the caller binds it. Callers
// that bind the ports (start, restart) retry on "address already in use".
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("etcdtest: reserve free port %d of %d: %v", len(ports)+1, n, err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}
