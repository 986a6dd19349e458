package com.github.stockctl.client;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import com.github.stockctl.v1.AcquireRequest;
import com.github.stockctl.v1.AcquireResponse;
import com.github.stockctl.v1.AllocateRequest;
import com.github.stockctl.v1.AllocateResponse;
import com.github.stockctl.v1.AuditResponse;
import com.github.stockctl.v1.CreateSKURequest;
import com.github.stockctl.v1.HoldAcquire;
import com.github.stockctl.v1.LockKind;
import com.github.stockctl.v1.OrderEvent;
import com.github.stockctl.v1.OrderState;
import com.github.stockctl.v1.OrderStreamResponse;
import com.github.stockctl.v1.PrepareResponse;
import com.github.stockctl.v1.ReserveResponse;
import com.github.stockctl.v1.StockStatus;
import com.github.stockctl.v1.WatchOrdersRequest;
import com.github.stockctl.v1.WatchOrdersResponse;
import com.github.stockctl.v1.WatchStatusRequest;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ForwardingClientCall;
import io.grpc.ForwardingClientCallListener;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import java.io.File;
import java.nio.file.Files;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.Statement;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.function.Function;
import org.junit.Test;

/** The client against real stockctl serve processes, started by the Go test clients/TestJavaClient. */
public class ClientTest {
  static final String TARGET = env("STOCKCTL_TARGET");
  static final String SPARE = System.getenv("STOCKCTL_SPARE_TARGET");
  static final long SPARE_PID = Long.parseLong(System.getenv().getOrDefault("STOCKCTL_SPARE_PID", "0"));
  static final String TOKEN = System.getenv("STOCKCTL_TOKEN");
  static final long COMPACTED = Long.parseLong(System.getenv().getOrDefault("STOCKCTL_COMPACTED", "0"));
  /** A SKU whose one order, "gone", was archived by prune. */
  static final String PRUNED_SKU = System.getenv().getOrDefault("STOCKCTL_PRUNED_SKU", "");
  /** A bound on a wait for something the test caused: never a measurement. */
  static final Duration BOUND = Duration.ofSeconds(60);

  static String env(String k) {
    String v = System.getenv(k);
    if (v == null || v.isEmpty()) {
      throw new IllegalStateException(k + " is not set: run these tests with `go test ./clients/`, which starts the serves they need");
    }
    return v;
  }

  static String name(String prefix) {
    return prefix + "-" + UUID.randomUUID().toString().substring(0, 10);
  }

  static StockctlClient.Builder client(String... targets) {
    StockctlClient.Builder b = StockctlClient.builder().token(TOKEN);
    if (targets.length == 0) {
      b.target(TARGET);
    }
    for (String t : targets) {
      b.target(t);
    }
    return b;
  }

  static <E extends StockctlException> E expect(Class<E> cls, Runnable r) {
    try {
      r.run();
    } catch (StockctlException e) {
      if (!cls.isInstance(e)) {
        throw new AssertionError("want " + cls.getSimpleName() + ", got " + e.getClass().getSimpleName() + ": " + e.getMessage(), e);
      }
      return cls.cast(e);
    }
    throw new AssertionError("want " + cls.getSimpleName() + ", got no error");
  }

  static void sleepUntil(Instant t) throws InterruptedException {
    long ms = Duration.between(Instant.now(), t).toMillis();
    if (ms > 0) {
      Thread.sleep(ms);
    }
  }

  @Test
  public void everyStockMethod() {
    try (StockctlClient c = client().build()) {
      String sku = name("j-stock");
      Function<String, String> o = n -> sku + "-" + n; // order IDs are unique across SKUs
      assertEquals(60, c.createSku(CreateSKURequest.newBuilder().setSku(sku).setTotal(100).setSegments(4).setInitialFill(40).build()).getPool());
      AllocateResponse a = c.allocate(AllocateRequest.newBuilder().setSku(sku).setOrder(o.apply("a-1")).setQty(2).setRouteKey("user-1").build());
      assertFalse(a.getReplayed());
      AllocateResponse again = c.allocate(sku, o.apply("a-1"), 2);
      assertTrue(again.getReplayed());
      assertEquals(a.getRevision(), again.getRevision());
      ReserveResponse r = c.reserve(sku, o.apply("r-1"), 3, Duration.ofMinutes(15));
      assertEquals(OrderState.ORDER_STATE_RESERVED, r.getState());
      assertFalse(c.confirm(sku, o.apply("r-1")).getReplayed());
      assertTrue(c.confirm(sku, o.apply("r-1")).getReplayed());
      c.reserve(sku, o.apply("r-2"), 1, Duration.ofMinutes(10));
      assertEquals(OrderState.ORDER_STATE_RESERVED, c.cancel(sku, o.apply("r-2")).getState());
      com.github.stockctl.v1.ReleaseResponse rel = c.release(sku, o.apply("a-1"));
      assertEquals(OrderState.ORDER_STATE_ALLOCATED, rel.getState());
      long released = rel.getRevision();
      assertTrue(c.release(sku, o.apply("a-1")).getReplayed());
      String dn = name("dn");
      assertEquals(150, c.restock(sku, 50, dn).getTotal());
      assertTrue(c.restock(sku, 50, dn).getReplayed());
      StockStatus s = c.status(sku);
      assertEquals(147, s.getRemaining());
      assertEquals(3, s.getAllocated());
      AuditResponse au = c.audit(sku);
      assertTrue(au.getProblemsList().toString(), au.getOk());
      try (StockctlClient.ServerStream<com.github.stockctl.v1.WatchStatusResponse> w =
          c.watchStatus(WatchStatusRequest.newBuilder().setSku(sku).build(), BOUND)) {
        assertEquals(147, w.next().getStatus().getRemaining());
      }
      List<String> events = new ArrayList<>();
      try (StockctlClient.ServerStream<WatchOrdersResponse> w =
          c.watchOrders(WatchOrdersRequest.newBuilder().setSku(sku).setSince(a.getRevision() - 1).build(), BOUND)) {
        while (w.hasNext()) {
          WatchOrdersResponse b = w.next();
          for (OrderEvent e : b.getEventsList()) {
            events.add(e.getOrder().substring(sku.length() + 1) + " " + OrderFeedConsumer.kind(e));
          }
          if (b.getCursor() >= released) { // the last order event (the restock after it is no order's)
            break;
          }
        }
      }
      assertEquals(List.of("a-1 allocated", "r-1 reserved", "r-1 confirmed", "r-2 reserved", "r-2 cancelled", "a-1 released"), events);
    }
  }

  @Test
  public void orderStream() throws Exception {
    try (StockctlClient c = client().build()) {
      String sku = name("j-os");
      c.createSku(sku, 40, 4, 40);
      List<String> orders = new ArrayList<>();
      for (int i = 0; i < 45; i++) {
        orders.add(sku + "-" + i);
      }
      List<java.util.concurrent.CompletableFuture<? extends com.google.protobuf.Message>> first = new ArrayList<>();
      try (OrderStream s = c.orderStream()) {
        for (int i = 0; i < orders.size(); i++) {
          first.add(i % 9 == 4 ? s.reserve(com.github.stockctl.v1.ReserveRequest.newBuilder().setSku(sku).setOrder(orders.get(i))
              .setQty(1).setTtl(StockctlClient.duration(Duration.ofMinutes(10))).build()) : s.allocate(sku, orders.get(i), 1));
        }
      }
      java.util.Map<String, Long> ok = new java.util.HashMap<>();
      int refused = 0;
      for (int i = 0; i < orders.size(); i++) {
        try {
          com.google.protobuf.Message m = first.get(i).join();
          long rev = m instanceof AllocateResponse ? ((AllocateResponse) m).getRevision() : ((ReserveResponse) m).getRevision();
          assertFalse(m instanceof AllocateResponse ? ((AllocateResponse) m).getReplayed() : ((ReserveResponse) m).getReplayed());
          ok.put(orders.get(i), rev);
        } catch (java.util.concurrent.CompletionException e) {
          StockctlException.SoldOut so = (StockctlException.SoldOut) e.getCause();
          assertEquals(1, so.want);
          assertTrue(so.revision > 0);
          refused++;
        }
      }
      assertEquals(40, ok.size());
      assertEquals(5, refused);
      try (OrderStream s = c.orderStream()) { // the same orders again: the taken ones are replayed
        List<java.util.concurrent.CompletableFuture<AllocateResponse>> again = new ArrayList<>();
        for (String o : orders) {
          if (ok.containsKey(o) && first.get(orders.indexOf(o)).join() instanceof AllocateResponse) {
            again.add(s.allocate(sku, o, 1));
          }
        }
        for (java.util.concurrent.CompletableFuture<AllocateResponse> f : again) {
          assertTrue(f.join().getReplayed());
          assertEquals((long) ok.get(f.join().getOrder()), f.join().getRevision());
        }
      }
      assertEquals(0, c.status(sku).getRemaining());
      assertEquals(40, c.audit(sku).getOrders());
    }
  }

  /** Lets the first OrderStream's orders commit, swallows their n answers, then breaks the stream. */
  static final class LoseStreamReplies implements ClientInterceptor {
    final int n;
    final List<OrderStreamResponse> swallowed = new java.util.concurrent.CopyOnWriteArrayList<>();
    final AtomicBoolean used = new AtomicBoolean();

    LoseStreamReplies(int n) {
      this.n = n;
    }

    @Override
    public <Q, A> ClientCall<Q, A> interceptCall(MethodDescriptor<Q, A> m, CallOptions o, Channel next) {
      ClientCall<Q, A> call = next.newCall(m, o);
      if (!m.getFullMethodName().endsWith("/OrderStream") || !used.compareAndSet(false, true)) {
        return call;
      }
      return new ForwardingClientCall.SimpleForwardingClientCall<Q, A>(call) {
        @Override
        public void start(Listener<A> l, Metadata h) {
          super.start(new ForwardingClientCallListener.SimpleForwardingClientCallListener<A>(l) {
            @Override
            public void onMessage(A message) {
              // A message carries its own answer and those in `more`.
              OrderStreamResponse msg = (OrderStreamResponse) message;
              if (msg.getOutcomeCase() != OrderStreamResponse.OutcomeCase.OUTCOME_NOT_SET) {
                swallowed.add(msg);
              }
              swallowed.addAll(msg.getMoreList());
              if (swallowed.size() >= n) {
                call.cancel("the test breaks the stream", null);
              } else {
                call.request(1); // what the stub would have asked for had it seen this answer
              }
            }

            @Override
            public void onClose(Status s, Metadata t) {
              super.onClose(swallowed.size() >= n ? Status.UNAVAILABLE.withDescription("the stream broke (test)") : s, new Metadata());
            }
          }, h);
        }
      };
    }
  }

  @Test
  public void unansweredOrdersResentAfterABreak() throws Exception {
    String sku = name("j-os-break");
    try (StockctlClient c = client().build()) {
      c.createSku(sku, 10, 2, 10);
    }
    LoseStreamReplies lose = new LoseStreamReplies(5);
    try (StockctlClient c = client().interceptor(lose).build()) {
      OrderStream stream = c.orderStream();
      List<java.util.concurrent.CompletableFuture<AllocateResponse>> futures = new ArrayList<>();
      for (int i = 0; i < 5; i++) {
        futures.add(stream.allocate(sku, sku + "-" + i, 1));
      }
      // the first stream committed all five and its answers were lost with it: the second stream
      // sent them again, with the same order IDs, and each answered replayed
      List<Long> revisions = new ArrayList<>();
      for (java.util.concurrent.CompletableFuture<AllocateResponse> f : futures) {
        AllocateResponse r = f.get(BOUND.toSeconds(), java.util.concurrent.TimeUnit.SECONDS);
        assertTrue(r.getReplayed());
        revisions.add(r.getRevision());
      }
      stream.close();
      assertEquals(5, lose.swallowed.size());
      List<Long> first = new ArrayList<>();
      for (OrderStreamResponse r : lose.swallowed) {
        first.add(r.getAllocated().getRevision());
      }
      java.util.Collections.sort(first);
      java.util.Collections.sort(revisions);
      assertEquals(first, revisions);
      assertEquals(5, c.status(sku).getRemaining());
    }
  }

  @Test
  public void listSkus() {
    try (StockctlClient c = client().build()) {
      String prefix = name("j-list");
      List<String> made = List.of(prefix + "-a", prefix + "-b", prefix + "-c");
      for (String s : List.of(made.get(2), made.get(0), made.get(1))) {
        c.createSku(s, 1, 1, 1);
      }
      List<String> listed = c.listSkus(2);
      List<String> mine = new ArrayList<>();
      for (String s : listed) {
        if (s.startsWith(prefix)) {
          mine.add(s);
        }
      }
      assertEquals(made, mine);
      List<String> sorted = new ArrayList<>(listed);
      java.util.Collections.sort(sorted);
      assertEquals(sorted, listed);
    }
  }

  @Test
  public void prepare() throws Exception {
    try (StockctlClient c = client().build()) {
      String prefix = name("j-prep");
      List<String> skus = List.of(prefix + "-a", prefix + "-b", prefix + "-c");
      for (String s : skus) {
        c.createSku(s, 10, 2, 10);
      }
      PrepareResponse p = c.prepare(List.of(skus.get(0), skus.get(1), skus.get(2), skus.get(0)));
      assertEquals(3, p.getSkus());
      assertEquals(3, p.getReady());
      assertEquals(0, p.getSkipped());
      StockctlException.SkuNotFound e =
          expect(StockctlException.SkuNotFound.class, () -> c.prepare(List.of(skus.get(0), prefix + "-nope")));
      assertTrue(e.getMessage(), e.getMessage().contains(prefix + "-nope"));
      expect(StockctlException.InvalidArgument.class, () -> c.prepare(List.of()));
      assertFalse(c.allocate(skus.get(1), "o-1", 1).getReplayed());
    }
  }

  @Test
  public void nextExpiry() throws Exception {
    try (StockctlClient c = client().build()) {
      String sku = name("j-nx");
      c.createSku(sku, 10, 2, 10);
      assertFalse(c.nextExpiry(sku).isPresent());
      c.reserve(sku, "r-late", 1, Duration.ofHours(1));
      ReserveResponse soon = c.reserve(sku, "r-soon", 1, Duration.ofMinutes(1));
      assertEquals(Instant.ofEpochSecond(soon.getDeadline().getSeconds(), soon.getDeadline().getNanos()), c.nextExpiry(sku).get());
      c.confirm(sku, "r-soon");
      c.cancel(sku, "r-late");
      assertFalse(c.nextExpiry(sku).isPresent());
      expect(StockctlException.SkuNotFound.class, () -> c.nextExpiry(name("j-nx-none")));
      expect(StockctlException.InvalidArgument.class, () -> c.nextExpiry("a b"));
    }
  }

  @Test
  public void refusals() throws Exception {
    try (StockctlClient c = client().build()) {
      String sku = name("j-err");
      c.createSku(sku, 5, 2, 5);
      assertEquals("qty", expect(StockctlException.InvalidArgument.class, () -> c.allocate(sku, sku + "-0", 0)).field);
      expect(StockctlException.SkuNotFound.class, () -> c.status(name("j-none")));
      expect(StockctlException.OrderNotFound.class, () -> c.confirm(sku, "no-such-order"));
      // A retry of an order prune archived is refused, never applied twice; so is its release.
      StockctlException.OrderPruned pruned = expect(StockctlException.OrderPruned.class, () -> c.allocate(PRUNED_SKU, "gone", 1));
      assertEquals(PRUNED_SKU, pruned.sku);
      assertEquals("gone", pruned.order);
      assertNotNull(pruned.pruned);
      expect(StockctlException.OrderPruned.class, () -> c.release(PRUNED_SKU, "gone"));
      expect(StockctlException.SkuExists.class, () -> c.createSku(sku, 5, 2, 5));
      c.allocate(sku, sku + "-1", 1);
      expect(StockctlException.OrderConflict.class, () -> c.allocate(sku, sku + "-1", 2));
      expect(StockctlException.OrderStateConflict.class, () -> c.confirm(sku, sku + "-1"));
      String dn = name("dn");
      c.restock(sku, 1, dn);
      expect(StockctlException.DeliveryConflict.class, () -> c.restock(sku, 2, dn));
      StockctlException.SoldOut so = expect(StockctlException.SoldOut.class, () -> c.allocate(sku, sku + "-2", 99));
      assertEquals(99, so.want);
      assertEquals(5, so.remaining);
      assertTrue(so.revision > 0);
      assertEquals(Status.Code.FAILED_PRECONDITION, so.code);

      String limited = name("j-limit");
      c.createSku(CreateSKURequest.newBuilder().setSku(limited).setTotal(10).setSegments(1).setInitialFill(10).setPerUserLimit(2).build());
      c.allocate(AllocateRequest.newBuilder().setSku(limited).setOrder(limited + "-1").setQty(2).setBuyer("user-9").build());
      StockctlException.PerUserLimitExceeded pl = expect(StockctlException.PerUserLimitExceeded.class,
          () -> c.allocate(AllocateRequest.newBuilder().setSku(limited).setOrder(limited + "-2").setQty(1).setBuyer("user-9").build()));
      assertEquals("user-9", pl.buyer);
      assertEquals(2, pl.limit);
      assertEquals(2, pl.held);

      ReserveResponse r = c.reserve(sku, sku + "-3", 1, Duration.ofSeconds(1));
      Instant deadline = Instant.ofEpochSecond(r.getDeadline().getSeconds(), r.getDeadline().getNanos());
      sleepUntil(deadline.plusMillis(200)); // the reservation's deadline (the server's clock is this machine's)
      StockctlException.ReservationExpired re = expect(StockctlException.ReservationExpired.class, () -> c.confirm(sku, sku + "-3"));
      assertEquals(sku + "-3", re.order);
      assertEquals(deadline, re.deadline);

      StockctlException.CursorAhead ca = expect(StockctlException.CursorAhead.class,
          () -> c.watchOrders(WatchOrdersRequest.newBuilder().setSku(sku).setSince(1_000_000_000_000L).build(), BOUND).hasNext());
      assertEquals(1_000_000_000_000L, ca.cursor);
      StockctlException.CursorCompacted cc = expect(StockctlException.CursorCompacted.class,
          () -> c.watchOrders(WatchOrdersRequest.newBuilder().setSince(1).build(), BOUND).hasNext());
      assertTrue(cc.compactRevision >= COMPACTED);
      expect(StockctlException.ResourceExhausted.class, () -> c.allocate("s".repeat(100000), "x", 1)); // BODY_TOO_LARGE or the transport's
    }
    try (StockctlClient anon = StockctlClient.builder().target(TARGET).build()) {
      expect(StockctlException.TokenMissing.class, () -> anon.status("any"));
    }
    try (StockctlClient wrong = StockctlClient.builder().target(TARGET).token("not-the-token-0123456789").build()) {
      expect(StockctlException.TokenInvalid.class, () -> wrong.status("any"));
    }
  }

  @Test
  public void lockRefusals() throws Exception {
    try (StockctlClient c = client().build()) {
      String name = name("j-busy");
      try (Lock held = c.lock(name, Duration.ofSeconds(30))) {
        StockctlException.LockBusy b = expect(StockctlException.LockBusy.class,
            () -> c.acquire(AcquireRequest.newBuilder().setName(name).setWait(StockctlClient.duration(Duration.ofSeconds(0))).build()));
        assertEquals(name, b.name);
        try (StockctlClient shortc = client().timeout(Duration.ofSeconds(1)).build()) {
          expect(StockctlException.DeadlineExceeded.class, () -> shortc.acquire(name, LockKind.LOCK_KIND_EXCLUSIVE, Duration.ofSeconds(5)));
        }
      }
      String sem = name("j-sem");
      try (Lock p = c.lock(HoldAcquire.newBuilder().setName(sem).setKind(LockKind.LOCK_KIND_SEMAPHORE).setLimit(2).build(), null)) {
        StockctlException.LimitMismatch lm = expect(StockctlException.LimitMismatch.class,
            () -> c.acquire(AcquireRequest.newBuilder().setName(sem).setKind(LockKind.LOCK_KIND_SEMAPHORE).setLimit(3).build()));
        assertEquals(3, lm.limit);
        assertEquals(2, lm.heldLimit);
      }
      expect(StockctlException.LockKindUnsupported.class,
          () -> c.acquire(AcquireRequest.newBuilder().setName(name("j-kind")).setKindValue(99).build()));
      expect(StockctlException.HoldNotFound.class, () -> c.keepAlive("h_NOSUCHHOLD"));
      String lapse = name("j-lapse");
      AcquireResponse h = c.acquire(lapse, LockKind.LOCK_KIND_EXCLUSIVE, Duration.ofSeconds(1));
      // no KeepAlive: wait until the server has let the hold go, seen as the lock being free (a
      // KeepAlive that beat the server's own timer would extend it)
      Instant bound = Instant.now().plus(BOUND);
      while (true) {
        try {
          c.releaseHold(c.acquire(AcquireRequest.newBuilder().setName(lapse).setWait(StockctlClient.duration(Duration.ZERO)).build()).getHoldId());
          break;
        } catch (StockctlException.LockBusy busy) {
          assertTrue("the server never let the hold go", Instant.now().isBefore(bound));
          Thread.sleep(100);
        }
      }
      StockctlException.LockLost ll = expect(StockctlException.LockLost.class, () -> c.keepAlive(h.getHoldId()));
      assertEquals(h.getToken(), ll.token);
      assertEquals("KEEPALIVE_TIMEOUT", ll.lostReason);
    }
  }

  @Test
  public void locks() throws Exception {
    try (StockctlClient c = client().build()) {
      String name = name("j-lock");
      long first;
      try (Lock held = c.lock(name, Duration.ofSeconds(1))) {
        first = held.token();
        assertTrue(first > 0);
        // three ttls without the caller doing anything: the background keep-alive holds it
        assertFalse(held.awaitLost(Duration.ofSeconds(3)));
        held.check();
      }
      HoldAcquire shared = HoldAcquire.newBuilder().setName(name).setKind(LockKind.LOCK_KIND_SHARED).build();
      long last;
      try (Lock a = c.lock(shared, null); Lock b = c.lock(shared, null)) {
        assertTrue(Math.min(a.token(), b.token()) > first);
        last = Math.max(a.token(), b.token());
      }
      AcquireResponse u = c.acquire(name, LockKind.LOCK_KIND_EXCLUSIVE, Duration.ofSeconds(10));
      assertTrue(u.getToken() > last);
      assertEquals(u.getToken(), c.keepAlive(u.getHoldId()).getToken());
      assertEquals(u.getToken(), c.releaseHold(u.getHoldId()).getToken());
      assertEquals(u.getToken(), c.releaseHold(u.getHoldId()).getToken()); // idempotent
      // an Acquire retried with its request_id answers the hold it was granted
      String rid = name("rid") + "-0123456789abcdef";
      AcquireRequest req = AcquireRequest.newBuilder().setName(name).setRequestId(rid).setTtl(StockctlClient.duration(Duration.ofSeconds(10))).build();
      AcquireResponse h1 = c.acquire(req);
      AcquireResponse h2 = c.acquire(req);
      assertTrue(h2.getReplayed());
      assertEquals(h1.getHoldId(), h2.getHoldId());
      assertEquals(h1.getToken(), h2.getToken());
      assertEquals(h1.getToken(), c.releaseByRequestId(rid).getToken());
      assertTrue(c.releaseByRequestId(name("never") + "-0123456789abcdef").getWithdrawn());

      Lock stalled = c.lock(name("j-stall"), Duration.ofSeconds(1));
      stalled.stopKeepAlives(); // as a stalled process would
      assertTrue("the server never reported the hold lost", stalled.awaitLost(BOUND));
      assertEquals("KEEPALIVE_TIMEOUT", stalled.lostError().lostReason);
      expect(StockctlException.LockLost.class, stalled::close);
    }
  }

  /** Lets the first Allocate reach the server and commit, then loses its reply. */
  static final class LoseFirstReply implements ClientInterceptor {
    final AtomicBoolean lost = new AtomicBoolean();

    @Override
    public <Q, A> ClientCall<Q, A> interceptCall(MethodDescriptor<Q, A> m, CallOptions o, Channel next) {
      boolean lose = m.getFullMethodName().endsWith("/Allocate");
      return new ForwardingClientCall.SimpleForwardingClientCall<Q, A>(next.newCall(m, o)) {
        @Override
        public void start(Listener<A> l, Metadata h) {
          super.start(new ForwardingClientCallListener.SimpleForwardingClientCallListener<A>(l) {
            boolean dropped; // this call's reply is the one lost

            @Override
            public void onMessage(A message) {
              if (lose && lost.compareAndSet(false, true)) {
                dropped = true;
                return;
              }
              super.onMessage(message);
            }

            @Override
            public void onClose(Status s, Metadata t) {
              if (dropped && s.isOk()) {
                super.onClose(Status.UNAVAILABLE.withDescription("the reply was lost (test)"), new Metadata());
                return;
              }
              super.onClose(s, t);
            }
          }, h);
        }
      };
    }
  }

  @Test
  public void serveKilled() throws Exception {
    assertTrue("no spare serve to kill", SPARE != null && SPARE_PID > 0);
    String sku = name("j-kill");
    try (StockctlClient a = client().build()) {
      a.createSku(sku, 10, 2, 10);
    }
    LoseFirstReply lose = new LoseFirstReply();
    List<StockctlException.LockLost> told = new ArrayList<>();
    try (StockctlClient c = client(SPARE, TARGET).interceptor(lose).build(); StockctlClient onSpare = client(SPARE).build();
        StockctlClient streams = client(SPARE, TARGET).build(); OrderStream stream = streams.orderStream()) {
      AllocateResponse got = c.allocate(sku, sku + "-1", 3);
      assertTrue(lose.lost.get());
      assertTrue("a retry of an order whose reply was lost must be replayed", got.getReplayed());
      assertEquals(TARGET, c.currentTarget());
      assertEquals(7, onSpare.status(sku).getRemaining());

      // an order stream on the spare: its first orders are answered there
      for (int i = 0; i < 2; i++) {
        assertFalse(stream.allocate(sku, sku + "-s-" + i, 1).join().getReplayed());
      }
      Lock held = onSpare.lock(HoldAcquire.newBuilder().setName(name("j-dropped")).setTtl(StockctlClient.duration(Duration.ofSeconds(60))).build(), told::add);
      ProcessHandle.of(SPARE_PID).orElseThrow().destroyForcibly(); // SIGKILL
      assertTrue("the lock was not reported lost when its stream dropped", held.awaitLost(BOUND));
      StockctlException.LockLost e = expect(StockctlException.LockLost.class, held::close);
      assertEquals(held.token(), e.token);
      assertEquals("STREAM_BROKEN", e.lostReason);
      assertEquals(List.of(e), told);
      // the spare is dead: once the stream has seen it (whether before or while orders are sent is
      // the race this wait removes), orders go to the other serve on a new stream
      Instant bound = Instant.now().plus(BOUND);
      while (stream.streaming() && Instant.now().isBefore(bound)) {
        Thread.sleep(10);
      }
      assertFalse("the order stream did not see its serve die", stream.streaming());
      for (int i = 2; i < 4; i++) {
        assertFalse(stream.allocate(sku, sku + "-s-" + i, 1).join().getReplayed());
      }
      assertEquals(TARGET, streams.currentTarget());
    }
    try (StockctlClient c = client(SPARE, TARGET).build()) {
      assertFalse(c.allocate(sku, sku + "-2", 1).getReplayed());
      assertEquals(TARGET, c.currentTarget());
      assertEquals(2, c.status(sku).getRemaining());
    }
    try (StockctlClient dead = client(SPARE).attempts(2).build()) {
      expect(StockctlException.Unavailable.class, () -> dead.status(sku));
    }
  }

  @Test
  public void feedConsumerKilledAndResumedExactly() throws Exception {
    try (StockctlClient c = client().build()) {
      String sku = name("j-feed");
      c.createSku(sku, 1000, 4, 400);
      long start = c.status(sku).getRevision();
      File db = new File(Files.createTempDirectory("jfeed").toFile(), "feed.db");
      long until = place(c, sku, "a", 30);
      assertEquals(137, consume(db, sku, start, until, 7));
      until = place(c, sku, "b", 30);
      assertEquals(137, consume(db, sku, start, until, 25));
      assertEquals(137, consume(db, sku, start, until, 3));
      until = place(c, sku, "c", 20);
      assertEquals(0, consume(db, sku, start, until, 0));

      List<String> want = new ArrayList<>();
      try (StockctlClient.ServerStream<WatchOrdersResponse> w =
          c.watchOrders(WatchOrdersRequest.newBuilder().setSku(sku).setSince(start).build(), BOUND)) {
        while (w.hasNext()) {
          WatchOrdersResponse b = w.next();
          for (OrderEvent e : b.getEventsList()) {
            want.add(e.getRevision() + " " + e.getOrder() + " " + OrderFeedConsumer.kind(e));
          }
          if (b.getCursor() >= until) {
            break;
          }
        }
      }
      List<String> got = new ArrayList<>();
      try (Connection conn = DriverManager.getConnection("jdbc:sqlite:" + db); Statement s = conn.createStatement()) {
        try (ResultSet r = s.executeQuery("SELECT revision, order_id, kind FROM events ORDER BY revision, order_id")) {
          while (r.next()) {
            got.add(r.getLong(1) + " " + r.getString(2) + " " + r.getString(3));
          }
        }
        assertEquals(want, got);
        assertTrue(want.size() > 80);
        try (ResultSet r = s.executeQuery("SELECT revision FROM stockctl_feed_cursor")) {
          assertTrue(r.next());
          assertTrue(r.getLong(1) >= until);
        }
        try (ResultSet r = s.executeQuery("SELECT COUNT(*) FROM orders")) {
          r.next();
          assertEquals(c.audit(sku).getOrders(), r.getLong(1));
        }
      }
    }
  }

  static long place(StockctlClient c, String sku, String tag, int n) {
    long last = 0;
    for (int i = 0; i < n; i++) {
      String o = sku + "-" + tag + "-" + i;
      if (i % 3 == 0) {
        last = c.reserve(sku, o, 1, Duration.ofMinutes(10)).getRevision();
        last = i % 2 == 0 ? c.confirm(sku, o).getRevision() : c.cancel(sku, o).getRevision();
      } else {
        last = c.allocate(sku, o, 2).getRevision();
        if (i % 5 == 0) {
          last = c.release(sku, o).getRevision();
        }
      }
    }
    return last;
  }

  /** Runs FeedConsumerMain in its own JVM; returns its exit code (137: it SIGKILLed itself). */
  static int consume(File db, String sku, long since, long until, int crashAfter) throws Exception {
    String java = ProcessHandle.current().info().command().orElse("java");
    ProcessBuilder pb = new ProcessBuilder(java, "-Djava.library.path=" + System.getProperty("java.library.path"),
        "-cp", System.getProperty("java.class.path"), FeedConsumerMain.class.getName(),
        TARGET, TOKEN, db.getPath(), sku, Long.toString(since), Long.toString(until), Integer.toString(crashAfter));
    pb.redirectErrorStream(true);
    Process p = pb.start();
    String out = new String(p.getInputStream().readAllBytes());
    int code = p.waitFor();
    if (code != 0 && code != 137) {
      fail("consumer exited " + code + ":\n" + out);
    }
    return code;
  }
}
