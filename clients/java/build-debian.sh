#!/usr/bin/env bash
# Builds and tests this module with what Debian 12 ships, without Maven or a
# network: protoc and grpc_java_plugin generate the stubs, javac compiles
# against the jars in /usr/share/java, JUnit 4 runs the tests.
#   apt-get install default-jdk-headless protobuf-compiler protobuf-compiler-grpc-java-plugin \
#     libgrpc-java libprotobuf-java libnetty-java libperfmark-java libgoogle-gson-java \
#     libanimal-sniffer-java libjsr305-java libgeronimo-annotation-1.3-spec-java \
#     libxerial-sqlite-jdbc-java junit4
# Usage: build-debian.sh OUT_DIR [test]   (`go test ./clients/` runs it with `test`, against
# the serves it starts; the tests read them from STOCKCTL_* variables)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$1
mode=${2:-build}
J=/usr/share/java
jars=(grpc-api grpc-context grpc-core grpc-netty grpc-protobuf grpc-protobuf-lite grpc-stub protobuf
	guava failureaccess perfmark-api gson jsr305 animal-sniffer-annotations error_prone_annotations
	geronimo-annotation-1.3-spec netty-buffer netty-codec netty-codec-http netty-codec-http2 netty-common
	netty-handler netty-handler-proxy netty-codec-socks netty-resolver netty-transport
	netty-transport-native-unix-common sqlite-jdbc junit4 hamcrest-core)
cp=""
for j in "${jars[@]}"; do
	if [ -e "$J/$j.jar" ]; then cp="$cp:$J/$j.jar"; fi
done
cp=${cp#:}
mkdir -p "$out/gen" "$out/classes"
echo "$cp" >"$out/classpath"
protoc -I "$here/../../api" -I "$here/../proto" --plugin=protoc-gen-grpc-java="$(command -v grpc_java_plugin)" \
	--java_out="$out/gen" --grpc-java_out="$out/gen" \
	"$here"/../../api/stockctl/v1/*.proto "$here/../proto/stockctl_client/rpc.proto"
find "$out/gen" "$here/src/main/java" -name '*.java' >"$out/main.txt"
javac -nowarn -encoding UTF-8 -d "$out/classes" -cp "$cp" @"$out/main.txt"
if [ "$mode" = test ]; then
	mkdir -p "$out/test-classes"
	find "$here/src/test/java" "$here/examples" -name '*.java' >"$out/test.txt"
	javac -encoding UTF-8 -d "$out/test-classes" -cp "$cp:$out/classes" @"$out/test.txt"
	tests=$(cd "$here/src/test/java" && find . -name '*Test.java' | sed 's|^\./||; s|\.java$||; s|/|.|g' | sort)
	exec java -Djava.library.path=/usr/lib/x86_64-linux-gnu/jni:/usr/lib/jni -cp "$cp:$out/classes:$out/test-classes" \
		org.junit.runner.JUnitCore $tests
fi
