//go:build unix

package clients_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const python = "/usr/bin/python3"

// needPython skips t where Debian's python3 with python3-grpcio is absent
// (.ci/run installs it).
func needPython(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(python); err != nil {
		t.Skipf("skipping the Python client's tests: no %s (apt-get install python3 python3-grpcio python3-grpc-tools, as .ci/run does)", python)
	}
	if out, err := exec.Command(python, "-c", "import grpc, google.protobuf").CombinedOutput(); err != nil {
		t.Skipf("skipping the Python client's tests: %s cannot import grpc (apt-get install python3-grpcio, as .ci/run does): %s", python, out)
	}
}

func pythonEnv(f *fleet) []string {
	dir, _ := filepath.Abs("python/src")
	return append(f.env(), "PYTHONPATH="+dir, "PYTHONDONTWRITEBYTECODE=1")
}

// TestPythonClient runs the Python client's test suite (clients/python/tests)
// and the docs' Python program against real serves.
func TestPythonClient(t *testing.T) {
	needPython(t)
	f := newFleet(t)
	out, err := run(t, "python", pythonEnv(f), python, "-m", "unittest", "discover", "-v", "-s", "tests", "-t", ".")
	t.Logf("python -m unittest:\n%s", out)
	if err != nil {
		t.Fatalf("the Python client's tests failed: %v", err)
	}
	// A suite that skipped or ran nothing proves nothing.
	if m := regexp.MustCompile(`(?m)^Ran (\d+) tests?`).FindStringSubmatch(out); m == nil || m[1] == "0" {
		t.Fatalf("the Python suite ran no tests")
	}
	if strings.Contains(out, "skipped") {
		t.Fatalf("the Python suite skipped tests")
	}

	// The docs' program runs against the package as pip installs it (from
	// a copy: a build writes build/ and egg-info next to the sources).
	sameAsDoc(t, "python", "python/examples/quickstart.py")
	progEnv := pythonEnv(f)
	if exec.Command(python, "-m", "pip", "--version").Run() == nil {
		tmp := t.TempDir()
		if out, err := exec.Command("cp", "-r", "python", filepath.Join(tmp, "src")).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v: %s", err, out)
		}
		site := filepath.Join(tmp, "site")
		out, err := run(t, tmp, os.Environ(), python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
			"--target", site, filepath.Join(tmp, "src"))
		if err != nil {
			t.Fatalf("pip install clients/python: %v: %s", err, out)
		}
		progEnv = append(f.env(), "PYTHONPATH="+site, "PYTHONDONTWRITEBYTECODE=1")
	} else {
		t.Logf("no pip for %s: the docs' program runs from clients/python/src", python)
	}
	out, err = run(t, "python", progEnv, python, "examples/quickstart.py", f.a.API, token)
	t.Logf("examples/quickstart.py:\n%s", out)
	if err != nil || !strings.Contains(out, "quickstart: ok") {
		t.Fatalf("the docs' Python program failed: %v", err)
	}
}

// TestPythonStubsFresh: the committed Python stubs are what generate.sh
// makes from the committed .proto files.
func TestPythonStubsFresh(t *testing.T) {
	needPython(t)
	if _, err := exec.LookPath("protoc"); err != nil {
		t.Skip("skipping: no protoc (apt-get install protobuf-compiler, as .ci/run does)")
	}
	if err := exec.Command(python, "-c", "import grpc_tools.protoc").Run(); err != nil {
		t.Skip("skipping: no grpc_tools (apt-get install python3-grpc-tools, as .ci/run does)")
	}
	work := t.TempDir()
	cmd := exec.Command("bash", "python/generate.sh")
	cmd.Env = append(os.Environ(), "OUT="+work)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("generate.sh: %v: %s", err, out)
	}
	gen, _ := filepath.Glob(filepath.Join(work, "stockctl", "v1", "*_pb2*"))
	gen2, _ := filepath.Glob(filepath.Join(work, "stockctl_client", "rpc_pb2*"))
	gen = append(gen, gen2...)
	if len(gen) < 10 {
		t.Fatalf("generate.sh made %d files", len(gen))
	}
	for _, g := range gen {
		rel, _ := filepath.Rel(work, g)
		want, _ := os.ReadFile(g)
		got, err := os.ReadFile(filepath.Join("python", "src", rel))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("clients/python/src/%s is stale (or missing): run clients/python/generate.sh", rel)
		}
	}
}
