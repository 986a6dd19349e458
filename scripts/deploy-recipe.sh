#!/usr/bin/env bash
# deploy-recipe.sh: docs/deploy.md's recipe, run on one machine over loopback.
#
# It creates a CA and etcd's server, peer and client certificates (openssl),
# starts a 3-member etcd cluster with TLS for clients and peers and
# authentication on 127.0.0.1, creates the root user and a user "stockctl"
# limited to the prefix /stockctl/, runs `stockctl serve` against it (API
# with TLS, tokens and client certificates), runs stockctl commands through
# it, sells a SKU through the API while the etcd leader is stopped and
# started again, puts HAProxy in front when installed, then adds a second
# (one-member) etcd cluster to the fleet, places a SKU in it, and removes
# it again (remove-cluster).
# Everything lives in a temporary directory, removed on exit with the
# processes. Any step that fails stops the script with a non-zero exit.
# e2e/deploy_recipe_test.go runs it.
#
# Needs: etcd and etcdctl (Debian: etcd-server, etcd-client), openssl, curl.
# Environment: STOCKCTL (the stockctl binary, default: stockctl on PATH),
# ETCD, ETCDCTL (binaries), loopback ports ETCD_PORT, ETCD_PORT_2,
# ETCD_PORT_3 (the members' client ports, defaults 23790, 23791, 23792),
# ETCD_PEER_PORT, ETCD_PEER_PORT_2, ETCD_PEER_PORT_3 (their peer ports,
# 23800, 23801, 23802), ETCD_B_PORT, ETCD_B_PEER_PORT (the second cluster's
# member, 23793, 23803), API_PORT, LB_PORT, LB_STATS_PORT (28443, 28444,
# 28445); SALE_ORDERS (the orders of the sale with a member stopped, 120);
# KEEP=1 keeps the directory.
set -euo pipefail

STOCKCTL=${STOCKCTL:-stockctl}
ETCD=${ETCD:-$(command -v etcd || echo /usr/bin/etcd)}
ETCDCTL=${ETCDCTL:-$(command -v etcdctl || echo /usr/bin/etcdctl)}
ETCD_PORT=${ETCD_PORT:-23790}
ETCD_PORT_2=${ETCD_PORT_2:-23791}
ETCD_PORT_3=${ETCD_PORT_3:-23792}
ETCD_PEER_PORT=${ETCD_PEER_PORT:-23800}
ETCD_PEER_PORT_2=${ETCD_PEER_PORT_2:-23801}
ETCD_PEER_PORT_3=${ETCD_PEER_PORT_3:-23802}
ETCD_B_PORT=${ETCD_B_PORT:-23793}
ETCD_B_PEER_PORT=${ETCD_B_PEER_PORT:-23803}
SALE_ORDERS=${SALE_ORDERS:-120}
API_PORT=${API_PORT:-28443}
LB_PORT=${LB_PORT:-28444}
LB_STATS_PORT=${LB_STATS_PORT:-28445}
for b in "$STOCKCTL" "$ETCD" "$ETCDCTL" openssl curl; do
  command -v "$b" >/dev/null || { echo "deploy-recipe: $b is not installed" >&2; exit 3; }
done

step() { echo; echo "== $*"; }
D=$(mktemp -d "${TMPDIR:-/tmp}/stockctl-deploy.XXXXXX")
PIDS=()
cleanup() {
  trap '' INT TERM
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "${KEEP:-}" = 1 ]; then echo "kept $D"; else rm -rf "$D"; fi
}
trap cleanup EXIT
trap "exit 130" INT TERM
# wait_for SECONDS COMMAND...: runs COMMAND (each try bounded to 10 s) every
# half second until it succeeds, for SECONDS at most.
wait_for() {
  local end=$((SECONDS + $1)); shift
  until timeout 10 "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$end" ]; then echo "deploy-recipe: gave up waiting for: $*" >&2; return 1; fi
    sleep 0.5
  done
}
cd "$D"
mkdir pki bin
# "stockctl" is $STOCKCTL, so that the commands read as in docs/deploy.md.
ln -s "$(command -v "$STOCKCTL")" bin/stockctl
PATH=$D/bin:$PATH

step "1. certificates: one CA; etcd's server and peer certificates; client certificates"
# <recipe:certs>
# The CA (keep ca.key offline in production).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
  -subj "/CN=stockctl etcd CA" -keyout pki/ca.key -out pki/ca.crt
# cert NAME CN EXTENDED-KEY-USAGE [SUBJECT-ALT-NAMES]: a key and a certificate signed by the CA.
cert() {
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -subj "/CN=$2" -keyout "pki/$1.key" -out "pki/$1.csr"
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$3"
    if [ -n "${4:-}" ]; then echo "subjectAltName=$4"; fi
  } >"pki/$1.ext"
  openssl x509 -req -in "pki/$1.csr" -CA pki/ca.crt -CAkey pki/ca.key -CAcreateserial \
    -days 825 -extfile "pki/$1.ext" -out "pki/$1.crt"
  rm "pki/$1.csr" "pki/$1.ext"
}
# Each member's server certificate names every address clients reach it by
# (in production: DNS:etcd-1,IP:10.0.0.11); its peer certificate, the same for peers.
for n in 1 2 3; do
  cert "etcd-$n-server" "etcd-$n" serverAuth,clientAuth "DNS:localhost,IP:127.0.0.1"
  cert "etcd-$n-peer"   "etcd-$n" serverAuth,clientAuth "DNS:localhost,IP:127.0.0.1"
done
# Client certificates: etcd takes the CN as the user when no password is given.
# admin: the operator's, CN root (etcdctl, stockctl reclaim); etcd-client: the stockctl servers'.
cert admin       root     clientAuth
cert etcd-client stockctl clientAuth
# The API's certificate (the names clients and the balancer use) and a client certificate for it.
cert api         localhost serverAuth "DNS:localhost,IP:127.0.0.1"
cert api-client  shop      clientAuth
# </recipe:certs>
openssl verify -CAfile pki/ca.crt pki/etcd-[123]-server.crt pki/etcd-[123]-peer.crt pki/admin.crt pki/etcd-client.crt pki/api.crt

step "2. etcd: 3 members on 127.0.0.1, TLS for clients and peers"
# <recipe:etcd>
CLUSTER="etcd-1=https://127.0.0.1:$ETCD_PEER_PORT,etcd-2=https://127.0.0.1:$ETCD_PEER_PORT_2,etcd-3=https://127.0.0.1:$ETCD_PEER_PORT_3"
# member N CLIENT-PORT PEER-PORT: starts member etcd-N (its data stays in etcd-N, so it restarts the same).
member() {
  "$ETCD" --name "etcd-$1" --data-dir "$D/etcd-$1" \
    --listen-client-urls "https://127.0.0.1:$2" --advertise-client-urls "https://127.0.0.1:$2" \
    --listen-peer-urls "https://127.0.0.1:$3" --initial-advertise-peer-urls "https://127.0.0.1:$3" \
    --initial-cluster "$CLUSTER" \
    --initial-cluster-state new --initial-cluster-token stockctl-1 \
    --cert-file "pki/etcd-$1-server.crt" --key-file "pki/etcd-$1-server.key" \
    --trusted-ca-file pki/ca.crt --client-cert-auth \
    --peer-cert-file "pki/etcd-$1-peer.crt" --peer-key-file "pki/etcd-$1-peer.key" \
    --peer-trusted-ca-file pki/ca.crt --peer-client-cert-auth \
    --auto-compaction-mode periodic --auto-compaction-retention 1h \
    --quota-backend-bytes 8589934592 >>"etcd-$1.log" 2>&1 &
}
# </recipe:etcd>
PORTS=("" "$ETCD_PORT" "$ETCD_PORT_2" "$ETCD_PORT_3")
PEER_PORTS=("" "$ETCD_PEER_PORT" "$ETCD_PEER_PORT_2" "$ETCD_PEER_PORT_3")
MPID=()
for n in 1 2 3; do
  member "$n" "${PORTS[$n]}" "${PEER_PORTS[$n]}"
  MPID[n]=$!
  PIDS+=($!)
done
ENDPOINTS="https://127.0.0.1:$ETCD_PORT,https://127.0.0.1:$ETCD_PORT_2,https://127.0.0.1:$ETCD_PORT_3"
E="$ETCDCTL --endpoints $ENDPOINTS --cacert pki/ca.crt --cert pki/admin.crt --key pki/admin.key"
if ! wait_for 30 $E endpoint health --cluster; then tail -20 etcd-*.log >&2; exit 1; fi
$E member list -w table
$E endpoint status -w table

step "3. etcd users: root, and stockctl limited to the prefix /stockctl/"
openssl rand -hex 24 >root-password
openssl rand -hex 24 >etcd-password
chmod 600 root-password etcd-password
# <recipe:users>
$E user add "root:$(cat root-password)" # etcd requires a root user before auth can be enabled
$E role add stockctl
$E role grant-permission stockctl --prefix=true readwrite /stockctl/
$E user add "stockctl:$(cat etcd-password)"
$E user grant-role stockctl stockctl
$E user grant-role root root
$E auth enable
# </recipe:users>
# With auth on, admin.crt (CN root) is the root user; stockctl's user sees its prefix only.
$E user list
if $ETCDCTL --endpoints "https://127.0.0.1:$ETCD_PORT" --cacert pki/ca.crt --cert pki/etcd-client.crt --key pki/etcd-client.key \
  --user "stockctl:$(cat etcd-password)" put /elsewhere x 2>/dev/null; then
  echo "deploy-recipe: user stockctl may write outside /stockctl/" >&2; exit 1
fi

step "4. stockctl serve against it (API: TLS, bearer tokens, client certificates)"
openssl rand -hex 24 >api-tokens
chmod 600 api-tokens
# <recipe:serve>
export STOCKCTL_USER=stockctl:$(cat etcd-password)
export STOCKCTL_ENDPOINTS=https://127.0.0.1:$ETCD_PORT,https://127.0.0.1:$ETCD_PORT_2,https://127.0.0.1:$ETCD_PORT_3
export STOCKCTL_CACERT=pki/ca.crt STOCKCTL_CERT=pki/etcd-client.crt STOCKCTL_KEY=pki/etcd-client.key
export STOCKCTL_PREFIX=/stockctl/
stockctl serve --api-addr "127.0.0.1:$API_PORT" --api-tokens api-tokens \
  --api-cert pki/api.crt --api-key pki/api.key --api-client-ca pki/ca.crt \
  --api-max-inflight 512 >serve.log 2>&1 &
# </recipe:serve>
SERVE=$!
PIDS+=($SERVE)
# The health check the balancer makes: grpc.health.v1 over Connect's JSON (no token needed).
health() {
  curl -sS --fail --cacert pki/ca.crt --cert pki/api-client.crt --key pki/api-client.key \
    -H 'Content-Type: application/json' -d '{}' "https://$1/grpc.health.v1.Health/Check"
}
if ! wait_for 60 sh -c "$(declare -f health); health localhost:$API_PORT | grep -q SERVING_STATUS_SERVING"; then
  cat serve.log >&2; health "localhost:$API_PORT" >&2 || true; exit 1
fi
health "localhost:$API_PORT"; echo

step "5. stockctl commands, straight to etcd and through the API"
stockctl init iphone --total 100 --segments 4
stockctl allocate iphone --order o-1 --qty 2 --route-key user-1
api() {
  curl -sS --fail-with-body --cacert pki/ca.crt --cert pki/api-client.crt --key pki/api-client.key \
    -H 'Content-Type: application/json' -H "Authorization: Bearer $(cat api-tokens)" \
    "https://localhost:$API_PORT/stockctl.v1.StockService/$1" -d "$2" "${@:3}"
}
api Allocate '{"sku":"iphone","order":"o-2","qty":3,"route_key":"user-2"}'; echo
stockctl status iphone
st=$(stockctl -o json status iphone)
grep -q '"allocated": *5' <<<"$st" || {
  echo "deploy-recipe: status does not count the 5 units allocated: $st" >&2; exit 1; }
stockctl audit iphone

step "6. a sale through the API while the etcd leader is stopped, and started again"
stockctl init sale --total "$((SALE_ORDERS + 1))" --segments 4
# sale N: N orders of one unit through the API, one after another; an order
# that fails (UNAVAILABLE during the election) is retried under its order ID
# (idempotent), each try bounded, 60 tries at most. Prints "ok ORDER TRIES".
sale() {
  local i try
  for i in $(seq 1 "$1"); do
    for try in $(seq 1 60); do
      if api Allocate "{\"sku\":\"sale\",\"order\":\"s-$i\",\"qty\":1,\"route_key\":\"u-$i\"}" \
        --max-time 10 >/dev/null 2>>sale.err; then
        echo "ok s-$i $try"; break
      fi
      if [ "$try" = 60 ]; then echo "failed s-$i"; return 1; fi
      sleep 0.25
    done
  done
}
sale "$SALE_ORDERS" >sale.log &
SALE=$!
PIDS+=($SALE)
# A third of the orders first, then the leader goes.
if ! wait_for 60 sh -c "[ \$(grep -c '^ok' sale.log) -ge $((SALE_ORDERS / 3)) ]"; then
  cat sale.log sale.err >&2; exit 1
fi
LEADER=$($E endpoint status -w simple | awk -F', ' '$5 == "true" { print $1 }')
L=0
for n in 1 2 3; do
  if [ "$LEADER" = "https://127.0.0.1:${PORTS[$n]}" ]; then L=$n; fi
done
[ "$L" != 0 ] || { echo "deploy-recipe: no leader among the members: $LEADER" >&2; $E endpoint status -w table >&2; exit 1; }
before=$(grep -c '^ok' sale.log)
kill "${MPID[L]}"
wait "${MPID[L]}" || true
echo "stopped etcd-$L, the leader, after $before of $SALE_ORDERS orders"
UP=()
for n in 1 2 3; do
  if [ "$n" != "$L" ]; then UP+=("https://127.0.0.1:${PORTS[$n]}"); fi
done
$ETCDCTL --endpoints "$(IFS=,; echo "${UP[*]}")" --cacert pki/ca.crt --cert pki/admin.crt --key pki/admin.key endpoint status -w table
# Orders go on with two members of three: at least a third more, while it is down.
if ! wait_for 60 sh -c "[ \$(grep -c '^ok' sale.log) -ge $((before + SALE_ORDERS / 3)) ]"; then
  cat sale.log sale.err >&2; exit 1
fi
during=$(( $(grep -c '^ok' sale.log) - before ))
# A new process (the CLI) sells too, its endpoint list naming the stopped member.
stockctl allocate sale --order s-cli --qty 1 --route-key u-cli
# The member comes back with its data and catches up.
member "$L" "${PORTS[L]}" "${PEER_PORTS[L]}"
MPID[L]=$!
PIDS+=($!)
if ! wait_for 60 $E endpoint health --cluster; then tail -20 "etcd-$L.log" >&2; exit 1; fi
echo "etcd-$L is back"
if ! wait "$SALE"; then cat sale.log sale.err >&2; exit 1; fi
retried=$(awk '$3 > 1' sale.log | wc -l)
echo "sale: $(grep -c '^ok' sale.log) of $SALE_ORDERS orders acknowledged through the API, $during of them while etcd-$L was stopped; $retried retried"
[ "$(grep -c '^ok' sale.log)" = "$SALE_ORDERS" ] || { cat sale.log sale.err >&2; exit 1; }
$E endpoint status -w table
st=$(stockctl -o json status sale)
grep -q "\"allocated\": *$((SALE_ORDERS + 1))," <<<"$st" || {
  echo "deploy-recipe: status of the sale: want all $((SALE_ORDERS + 1)) units allocated: $st" >&2; exit 1; }
# Sold out: one more order is refused (exit 3), and the books balance.
rc=0
stockctl allocate sale --order s-extra --qty 1 2>extra.err || rc=$?
if [ "$rc" != 3 ]; then
  echo "deploy-recipe: an order beyond the stock: exit $rc, want 3 (insufficient stock)" >&2; cat extra.err >&2; exit 1
fi
cat extra.err
stockctl audit sale

step "7. reclaim needs the root user: refused as stockctl, done with admin.crt"
if stockctl reclaim 2>reclaim.err; then echo "deploy-recipe: reclaim as stockctl succeeded" >&2; exit 1; fi
cat reclaim.err
grep -q "root user" reclaim.err || { echo "deploy-recipe: reclaim's refusal does not name the root user" >&2; exit 1; }
# <recipe:reclaim>
STOCKCTL_USER= stockctl --cert pki/admin.crt --key pki/admin.key reclaim
# </recipe:reclaim>

step "8. HAProxy in front (TCP passthrough, health by grpc.health.v1)"
if ! command -v haproxy >/dev/null; then
  echo "haproxy is not installed: skipped"
else
  cat pki/api-client.crt pki/api-client.key >pki/haproxy-check.pem
  # <recipe:haproxy>
  cat >haproxy.cfg <<EOF
global
    maxconn 1024
defaults
    timeout connect 5s
    timeout client 1h
    timeout server 1h
frontend stockctl_api
    bind 127.0.0.1:$LB_PORT
    mode tcp
    default_backend stockctl
backend stockctl
    mode tcp
    balance leastconn
    # grpc.health.v1 in Connect's JSON over HTTP/1.1 and TLS: SERVING_STATUS_SERVING, not SERVING_STATUS_NOT_SERVING
    option httpchk
    http-check send meth POST uri /grpc.health.v1.Health/Check ver HTTP/1.1 hdr Host localhost hdr Content-Type application/json body "{}"
    http-check expect string SERVING_STATUS_SERVING
    default-server check check-ssl check-sni localhost ca-file $D/pki/ca.crt crt $D/pki/haproxy-check.pem inter 2s
    server s1 127.0.0.1:$API_PORT
EOF
  # </recipe:haproxy>
  # Not in the recipe: a stats page, to see the check's verdict.
  printf 'listen stats\n    bind 127.0.0.1:%s\n    mode http\n    stats enable\n    stats uri /stats\n' "$LB_STATS_PORT" >>haproxy.cfg
  haproxy -c -f haproxy.cfg
  haproxy -db -f haproxy.cfg >haproxy.log 2>&1 &
  PIDS+=($!)
  if ! wait_for 30 sh -c "$(declare -f health); health localhost:$LB_PORT | grep -q SERVING_STATUS_SERVING"; then
    cat haproxy.log >&2; exit 1
  fi
  health "localhost:$LB_PORT"; echo
  # The server is up by its health check (L7OK), not only by default.
  if ! wait_for 30 sh -c "curl -sS 'http://127.0.0.1:$LB_STATS_PORT/stats;csv' | grep '^stockctl,s1,' | grep -q L7OK"; then
    curl -sS "http://127.0.0.1:$LB_STATS_PORT/stats;csv" >&2; cat haproxy.log >&2; exit 1
  fi
  echo "haproxy: server s1 is up by its grpc.health.v1 check (L7OK)"
fi

step "9. a second etcd cluster: the fleet grows to two, a SKU lives in the second, the second is removed again"
# east-2: one member (TLS, the same CA, users and prefix as the first cluster).
cert etcd-b1-server etcd-b1 serverAuth,clientAuth "DNS:localhost,IP:127.0.0.1"
cert etcd-b1-peer   etcd-b1 serverAuth,clientAuth "DNS:localhost,IP:127.0.0.1"
"$ETCD" --name etcd-b1 --data-dir "$D/etcd-b1" \
  --listen-client-urls "https://127.0.0.1:$ETCD_B_PORT" --advertise-client-urls "https://127.0.0.1:$ETCD_B_PORT" \
  --listen-peer-urls "https://127.0.0.1:$ETCD_B_PEER_PORT" --initial-advertise-peer-urls "https://127.0.0.1:$ETCD_B_PEER_PORT" \
  --initial-cluster "etcd-b1=https://127.0.0.1:$ETCD_B_PEER_PORT" --initial-cluster-state new --initial-cluster-token stockctl-2 \
  --cert-file pki/etcd-b1-server.crt --key-file pki/etcd-b1-server.key --trusted-ca-file pki/ca.crt --client-cert-auth \
  --peer-cert-file pki/etcd-b1-peer.crt --peer-key-file pki/etcd-b1-peer.key --peer-trusted-ca-file pki/ca.crt --peer-client-cert-auth \
  >etcd-b1.log 2>&1 &
EB_PID=$!
PIDS+=($EB_PID)
EB="$ETCDCTL --endpoints https://127.0.0.1:$ETCD_B_PORT --cacert pki/ca.crt --cert pki/admin.crt --key pki/admin.key"
if ! wait_for 30 $EB endpoint health; then tail -20 etcd-b1.log >&2; exit 1; fi
$EB user add "root:$(cat root-password)"
$EB role add stockctl
$EB role grant-permission stockctl --prefix=true readwrite /stockctl/
$EB user add "stockctl:$(cat etcd-password)"
$EB user grant-role stockctl stockctl
$EB user grant-role root root
$EB auth enable
# serve_with CLUSTERS: stops serve (if it runs) and starts it again on STOCKCTL_CLUSTERS=CLUSTERS.
serve_with() {
  kill "$SERVE" 2>/dev/null || true
  wait "$SERVE" || true
  export STOCKCTL_ENDPOINTS= STOCKCTL_CLUSTERS="$1"
  stockctl serve --api-addr "127.0.0.1:$API_PORT" --api-tokens api-tokens \
    --api-cert pki/api.crt --api-key pki/api.key --api-client-ca pki/ca.crt \
    --api-max-inflight 512 >>serve.log 2>&1 &
  SERVE=$!
  PIDS+=($SERVE)
  if ! wait_for 60 sh -c "$(declare -f health); health localhost:$API_PORT | grep -q SERVING_STATUS_SERVING"; then
    tail -30 serve.log >&2; exit 1
  fi
}
EAST1="east-1=$ENDPOINTS"
EAST2="east-2=https://127.0.0.1:$ETCD_B_PORT"
# From one cluster to several (docs/deploy.md): the old cluster first, with every process
# stopped. The fleet is first recorded with east-1 alone, so east-2 is added to it: it holds no
# named lock, and is removed without stopping the fleet.
kill "$SERVE"
wait "$SERVE" || true
STOCKCTL_ENDPOINTS= STOCKCTL_CLUSTERS="$EAST1" stockctl list
serve_with "$EAST1;$EAST2"
echo "serve runs on clusters east-1 (3 members) and east-2 (1 member)"
stockctl init tablet --total 20 --segments 2 --cluster east-2
api Allocate '{"sku":"tablet","order":"t-1","qty":2,"route_key":"user-1"}'; echo
stockctl list
stockctl audit tablet
# Refused while tablet is there (exit 5, naming it); --drain keeps the removal begun.
rc=0
stockctl remove-cluster east-2 --drain 2>remove.err || rc=$?
cat remove.err
if [ "$rc" != 5 ] || ! grep -q tablet remove.err; then echo "deploy-recipe: remove-cluster east-2 holding tablet: exit $rc, want 5 naming it" >&2; exit 1; fi
rc=0
stockctl init tablet2 --total 5 --segments 1 --cluster east-2 2>init.err || rc=$?
cat init.err
if [ "$rc" != 5 ]; then echo "deploy-recipe: init in draining east-2: exit $rc, want 5" >&2; exit 1; fi
# Its orders, read before it goes (every cluster's current orders: step 7 compacted east-1's
# history), then its delete: serve keeps the segment it sold from for about 10 s after its last
# order, so the delete is retried.
stockctl orders --all --snapshot
wait_for 60 stockctl delete tablet --force
stockctl remove-cluster east-2
END=$(stockctl -o json remove-cluster east-2 2>&1 || true)
echo "$END" | grep -q "was removed" || { echo "deploy-recipe: a second remove-cluster: $END" >&2; exit 1; }
# A process given the old list is refused; serve goes on with the new one.
serve_with "$EAST1"
stockctl list
api Allocate '{"sku":"iphone","order":"o-3","qty":1,"route_key":"user-3"}'; echo
stockctl audit iphone
# A merged cursor that does not name east-2 would skip its events: refused (exit 2).
rc=0
stockctl orders --all --since "east-1=1" 2>cursor.err || rc=$?
cat cursor.err
if [ "$rc" != 2 ] || ! grep -q east-2 cursor.err; then echo "deploy-recipe: a merged cursor without east-2: exit $rc, want 2 naming it" >&2; exit 1; fi
kill "$EB_PID"
wait "$EB_PID" || true
echo "east-2 removed and stopped; serve sells on east-1"

step "done: the recipe ran"
