package keys

import (
	"testing"
)

func TestNamedLayout(t *testing.T) {
	s, _ := New("/p")
	cases := map[string]string{
		s.Lock("job"):                                  "/p/locks/job/",
		s.SharedLock("job"):                            "/p/locks/job/s/",
		s.Semaphore("pool"):                            "/p/sems/pool/",
		s.Delay(s.Lock("job")):                         "/p/delays/locks/job/",
		s.Delay(s.Semaphore("pool")):                   "/p/delays/sems/pool/",
		ExclusiveWaiter(s.Lock("job"), 0x3d26):         "/p/locks/job/3d26",
		SeqWaiter(s.SharedLock("job"), 0x3d26, 7):      "/p/locks/job/s/3d26-7",
		SeqWaiter(s.Semaphore("pool"), 0x7fffffff, 12): "/p/sems/pool/7fffffff-12",
		ExclusiveEnd(s.Lock("job")):                    "/p/locks/job/s",
	}
	for got, want := range cases {
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
	// Every exclusive key sorts below ExclusiveEnd, every shared key above.
	end := ExclusiveEnd(s.Lock("job"))
	for _, lease := range []int64{1, 0xf, 0xffffffffffff, 0x7fffffffffffffff} {
		if k := ExclusiveWaiter(s.Lock("job"), lease); !(k < end) {
			t.Errorf("exclusive key %q not below %q", k, end)
		}
		if k := SeqWaiter(s.SharedLock("job"), lease, 0); k < end {
			t.Errorf("shared key %q below %q", k, end)
		}
	}
}

func TestParseNamed(t *testing.T) {
	s, _ := New("/p/")
	good := []struct {
		key  string
		want NamedKey
	}{
		{"/p/locks/job/3d26", NamedKey{Name: "job", Kind: NamedExclusive, Lease: 0x3d26, Seq: -1}},
		{"/p/locks/job/s/3d26-0", NamedKey{Name: "job", Kind: NamedShared, Lease: 0x3d26, Seq: 0}},
		{"/p/sems/db/ab-12", NamedKey{Name: "db", Kind: NamedSemaphore, Lease: 0xab, Seq: 12}},
	}
	for _, tc := range good {
		got, err := s.ParseNamed(tc.key)
		if err != nil || got != tc.want {
			t.Errorf("ParseNamed(%q) = %+v, %v; want %+v", tc.key, got, err, tc.want)
		}
	}
	for _, key := range []string{
		"/p/locks/job", "/p/locks//3d", "/p/locks/job/xyz", "/p/locks/job/s/3d26", "/p/locks/job/s/3d-x",
		"/p/sems/db/ab", "/p/sems/db/ab-01", "/p/sems/db/-1", "/q/locks/job/1", "/p/locks/job/03d",
	} {
		if k, err := s.ParseNamed(key); err == nil {
			t.Errorf("ParseNamed(%q) = %+v, want an error", key, k)
		}
	}
}

func FuzzParseNamed(f *testing.F) {
	s, _ := New("/p/")
	for _, seed := range []string{"/p/locks/job/3d26", "/p/locks/job/s/3d26-0", "/p/sems/db/ab-12", "/p/sems//-"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, key string) {
		k, err := s.ParseNamed(key)
		if err != nil {
			return
		}
		var again string
		switch k.Kind {
		case NamedExclusive:
			again = ExclusiveWaiter(s.Lock(k.Name), k.Lease)
		case NamedShared:
			again = SeqWaiter(s.SharedLock(k.Name), k.Lease, k.Seq)
		case NamedSemaphore:
			again = SeqWaiter(s.Semaphore(k.Name), k.Lease, k.Seq)
		}
		if again != key {
			t.Fatalf("%q parsed to %+v, which builds %q", key, k, again)
		}
	})
}
