//go:build unix

package clients_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// needJava skips t where a JDK, protoc with grpc_java_plugin or Debian's
// gRPC-Java jars are absent (.ci/run installs them).
func needJava(t *testing.T) {
	t.Helper()
	const install = "apt-get install default-jdk-headless protobuf-compiler protobuf-compiler-grpc-java-plugin libgrpc-java libprotobuf-java libnetty-java libperfmark-java libgoogle-gson-java libanimal-sniffer-java libjsr305-java libgeronimo-annotation-1.3-spec-java libxerial-sqlite-jdbc-java junit4, as .ci/run does"
	for _, tool := range []string{"javac", "java", "protoc", "grpc_java_plugin"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("skipping the Java client's tests: no %s (%s)", tool, install)
		}
	}
	for _, jar := range []string{"grpc-netty", "grpc-stub", "protobuf", "netty-codec-http2", "perfmark-api", "gson", "geronimo-annotation-1.3-spec", "sqlite-jdbc", "junit4"} {
		if _, err := os.Stat("/usr/share/java/" + jar + ".jar"); err != nil {
			t.Skipf("skipping the Java client's tests: no /usr/share/java/%s.jar (%s)", jar, install)
		}
	}
}

// TestJavaClient builds the Java client with Debian's jars
// (clients/java/build-debian.sh) and runs its JUnit tests and the docs'
// Java program against real serves.
func TestJavaClient(t *testing.T) {
	needJava(t)
	sameAsDoc(t, "java", "java/examples/Quickstart.java")
	f := newFleet(t)
	out := t.TempDir()
	log, err := run(t, ".", f.env(), "bash", "java/build-debian.sh", out, "test")
	t.Logf("JUnit:\n%s", log)
	if err != nil {
		t.Fatalf("the Java client's tests failed: %v", err)
	}
	if m := regexp.MustCompile(`(?m)^OK \((\d+) tests?\)`).FindStringSubmatch(log); m == nil || m[1] == "0" {
		t.Fatalf("JUnit ran no tests")
	}
	cp := javaClasspath(t, out)
	log, err = run(t, ".", f.env(), "java", "-Djava.library.path=/usr/lib/x86_64-linux-gnu/jni:/usr/lib/jni", "-cp", cp, "Quickstart", f.a.API, token)
	t.Logf("Quickstart:\n%s", log)
	if err != nil || !strings.Contains(log, "quickstart: ok") {
		t.Fatalf("the docs' Java program failed: %v", err)
	}
}

// javaClasspath is the classpath build-debian.sh wrote, with its output.
func javaClasspath(t *testing.T, out string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(out, "classpath"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(raw)) + ":" + filepath.Join(out, "classes") + ":" + filepath.Join(out, "test-classes")
}
