//go:build unix

package service_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	stockctlv1 "github.com/stockctl/stockctl/api/stockctl/v1"
)

// The committed Go code was generated from the committed .proto files: a
// .proto edited without `go generate ./api/...` fails here. The .proto
// files are compiled by another compiler (protoc, from Debian's
// python3-grpc-tools) and compared with the descriptors embedded in the
// Go code.
func TestGeneratedCodeMatchesProto(t *testing.T) {
	t.Parallel()
	python := pythonWithGRPC(t)
	out := filepath.Join(t.TempDir(), "set.pb")
	args := []string{"-m", "grpc_tools.protoc", "-I", "../api", "--descriptor_set_out=" + out}
	for _, f := range generatedFiles {
		args = append(args, f.Path())
	}
	if msg, err := run(t, python, args...); err != nil {
		t.Fatalf("protoc: %v: %s", err, msg)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(raw, &set); err != nil {
		t.Fatal(err)
	}
	compiled := map[string]*descriptorpb.FileDescriptorProto{}
	for _, f := range set.File {
		compiled[f.GetName()] = f
	}
	for _, fd := range generatedFiles {
		want := compiled[fd.Path()]
		got := protodesc.ToFileDescriptorProto(fd)
		if want == nil {
			t.Fatalf("protoc did not compile %s", fd.Path())
		}
		normalize(want)
		normalize(got)
		if !proto.Equal(want, got) {
			t.Errorf("%s: the Go code does not match the .proto: run `go generate ./api/...`\nproto: %v\ngo:    %v",
				fd.Path(), short(want), short(got))
		}
	}
}

var generatedFiles = []protoreflect.FileDescriptor{
	stockctlv1.File_stockctl_v1_stock_service_proto,
	stockctlv1.File_stockctl_v1_lock_service_proto,
	stockctlv1.File_stockctl_v1_errors_proto,
	stockctlv1.File_stockctl_v1_inspect_service_proto,
}

// normalize drops what compilers fill in differently: source info and
// json_name (derived from the field name either way).
func normalize(f *descriptorpb.FileDescriptorProto) {
	f.SourceCodeInfo = nil
	var msgs func([]*descriptorpb.DescriptorProto)
	msgs = func(ms []*descriptorpb.DescriptorProto) {
		for _, m := range ms {
			for _, fl := range m.Field {
				fl.JsonName = nil
			}
			msgs(m.NestedType)
		}
	}
	msgs(f.MessageType)
}

func short(m proto.Message) string {
	s := m.(interface{ String() string }).String()
	if len(s) > 2000 {
		s = s[:2000] + "…"
	}
	return strings.TrimSpace(s)
}
