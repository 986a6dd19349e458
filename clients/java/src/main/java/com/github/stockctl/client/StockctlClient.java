package com.github.stockctl.client;

import com.github.stockctl.v1.AcquireRequest;
import com.github.stockctl.v1.AcquireResponse;
import com.github.stockctl.v1.AllocateOrderRequest;
import com.github.stockctl.v1.AllocateOrderResponse;
import com.github.stockctl.v1.AllocateRequest;
import com.github.stockctl.v1.AllocateResponse;
import com.github.stockctl.v1.AuditRequest;
import com.github.stockctl.v1.AuditResponse;
import com.github.stockctl.v1.CancelRequest;
import com.github.stockctl.v1.CancelResponse;
import com.github.stockctl.v1.ConfirmRequest;
import com.github.stockctl.v1.ConfirmResponse;
import com.github.stockctl.v1.CreateSKURequest;
import com.github.stockctl.v1.CreateSKUResponse;
import com.github.stockctl.v1.HoldAcquire;
import com.github.stockctl.v1.KeepAliveRequest;
import com.github.stockctl.v1.KeepAliveResponse;
import com.github.stockctl.v1.ListSKUsRequest;
import com.github.stockctl.v1.ListSKUsResponse;
import com.github.stockctl.v1.LockKind;
import com.github.stockctl.v1.LockServiceGrpc;
import com.github.stockctl.v1.LockServiceReleaseRequest;
import com.github.stockctl.v1.LockServiceReleaseResponse;
import com.github.stockctl.v1.NextExpiryRequest;
import com.github.stockctl.v1.NextExpiryResponse;
import com.github.stockctl.v1.OrderLine;
import com.github.stockctl.v1.PrepareRequest;
import com.github.stockctl.v1.PrepareResponse;
import com.github.stockctl.v1.ReleaseRequest;
import com.github.stockctl.v1.ReleaseResponse;
import com.github.stockctl.v1.ReserveOrderRequest;
import com.github.stockctl.v1.ReserveOrderResponse;
import com.github.stockctl.v1.ReserveRequest;
import com.github.stockctl.v1.ReserveResponse;
import com.github.stockctl.v1.RestockRequest;
import com.github.stockctl.v1.RestockResponse;
import com.github.stockctl.v1.StatusRequest;
import com.github.stockctl.v1.StockServiceGrpc;
import com.github.stockctl.v1.StockStatus;
import com.github.stockctl.v1.WatchOrdersRequest;
import com.github.stockctl.v1.WatchOrdersResponse;
import com.github.stockctl.v1.WatchStatusRequest;
import com.github.stockctl.v1.WatchStatusResponse;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ClientInterceptors;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.ClientCalls;
import io.grpc.stub.MetadataUtils;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;
import java.util.Optional;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;

/**
 * A client of one or more {@code stockctl serve} processes sharing an etcd.
 *
 * <p>Calls go to the first target; a call that fails with UNAVAILABLE, CANCELLED or
 * DEADLINE_EXCEEDED (or is refused with OVERLOADED or CONTENTION) is retried with the <b>same
 * request</b> on the next target, up to {@code attempts} times with exponential backoff: orders,
 * reservations, confirms, cancels, releases and restocks are idempotent by their IDs, so a retry
 * whose first attempt landed answers {@code replayed = true} and deducts nothing. CreateSKU, KeepAlive
 * and Release are not retried; Acquire is, on the same server, with its request_id. Answers are the API's messages ({@code com.github.stockctl.v1});
 * errors are {@link StockctlException}'s nested classes, one per reason.
 */
public final class StockctlClient implements AutoCloseable {
  final List<String> targets;
  final Duration timeout;
  final int attempts;
  final Duration backoff;
  final Duration maxBackoff;
  private final List<ManagedChannel> channels = new ArrayList<>();
  private final List<Channel> wrapped = new ArrayList<>();
  private int current;

  /** A builder of a client. */
  public static final class Builder {
    private final List<String> targets = new ArrayList<>();
    private String token;
    private boolean plaintext = true;
    private Duration timeout = Duration.ofSeconds(10);
    private int attempts = 5;
    private Duration backoff = Duration.ofMillis(50);
    private Duration maxBackoff = Duration.ofSeconds(2);
    private final List<ClientInterceptor> interceptors = new ArrayList<>();

    /** Adds a serve's host:port; retries go on to the next. */
    public Builder target(String hostPort) {
      targets.add(hostPort);
      return this;
    }

    /** The bearer token. */
    public Builder token(String token) {
      this.token = token;
      return this;
    }

    /** TLS (with the JVM's trust store) instead of cleartext HTTP/2, which only loopback allows. */
    public Builder useTransportSecurity() {
      this.plaintext = false;
      return this;
    }

    /** Each attempt's deadline (10s). */
    public Builder timeout(Duration timeout) {
      this.timeout = timeout;
      return this;
    }

    /** Attempts of a retried call (5). */
    public Builder attempts(int attempts) {
      this.attempts = Math.max(1, attempts);
      return this;
    }

    /** The first backoff (50ms), doubled per attempt up to max (2s), with jitter. */
    public Builder backoff(Duration first, Duration max) {
      this.backoff = first;
      this.maxBackoff = max;
      return this;
    }

    /** A gRPC interceptor on every channel. */
    public Builder interceptor(ClientInterceptor i) {
      interceptors.add(i);
      return this;
    }

    public StockctlClient build() {
      if (targets.isEmpty()) {
        throw new IllegalArgumentException("no target");
      }
      return new StockctlClient(this);
    }
  }

  public static Builder builder() {
    return new Builder();
  }

  private StockctlClient(Builder b) {
    this.targets = List.copyOf(b.targets);
    this.timeout = b.timeout;
    this.attempts = b.attempts;
    this.backoff = b.backoff;
    this.maxBackoff = b.maxBackoff;
    Metadata md = new Metadata();
    if (b.token != null) {
      md.put(Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER), "Bearer " + b.token);
    }
    for (String t : targets) {
      ManagedChannelBuilder<?> cb = ManagedChannelBuilder.forTarget(t)
          // keepalive pings find a dead server under a quiet stream (a held lock, an idle feed)
          .keepAliveTime(10, TimeUnit.SECONDS).keepAliveTimeout(5, TimeUnit.SECONDS);
      if (b.plaintext) {
        cb.usePlaintext();
      }
      ManagedChannel ch = cb.build();
      channels.add(ch);
      List<ClientInterceptor> is = new ArrayList<>(b.interceptors);
      is.add(MetadataUtils.newAttachHeadersInterceptor(md));
      wrapped.add(ClientInterceptors.intercept(ch, is));
    }
  }

  @Override
  public void close() {
    for (ManagedChannel ch : channels) {
      ch.shutdownNow();
    }
  }

  synchronized int target() {
    return current;
  }

  /** The target calls go to now. */
  public String currentTarget() {
    return targets.get(target());
  }

  synchronized void failover(int failed) {
    if (current == failed) {
      current = (failed + 1) % targets.size();
    }
  }

  Channel channel(int i) {
    return wrapped.get(i);
  }

  long delayMillis(int attempt, StockctlException e) {
    long d = Math.min(maxBackoff.toMillis(), backoff.toMillis() << Math.min(attempt, 20));
    d = (long) (d * ThreadLocalRandom.current().nextDouble(0.5, 1.0));
    if (e.retryDelay != null) {
      d = Math.max(d, e.retryDelay.toMillis());
    }
    return d;
  }

  private <Q, A> A unary(MethodDescriptor<Q, A> method, Q request, boolean retry, Duration deadline) {
    return unary(method, request, retry, deadline, -1);
  }

  /** A call, retried if retry; on the given target only (its retries too), or -1: the current, failing over. */
  private <Q, A> A unary(MethodDescriptor<Q, A> method, Q request, boolean retry, Duration deadline, int on) {
    int n = retry ? attempts : 1;
    for (int attempt = 0; ; attempt++) {
      int i = on >= 0 ? on : target();
      try {
        CallOptions o = CallOptions.DEFAULT.withDeadlineAfter((deadline == null ? timeout : deadline).toMillis(), TimeUnit.MILLISECONDS);
        return ClientCalls.blockingUnaryCall(channel(i), method, o, request);
      } catch (StatusRuntimeException sre) {
        StockctlException e = StockctlException.from(sre);
        if (attempt + 1 >= n || !e.retryable()) {
          throw e;
        }
        if (on < 0) {
          failover(i);
        }
        try {
          Thread.sleep(delayMillis(attempt, e));
        } catch (InterruptedException ie) {
          Thread.currentThread().interrupt();
          throw e;
        }
      }
    }
  }

  // -- StockService ------------------------------------------------------

  /** Creates a SKU. Not retried: a retry whose first attempt landed would answer SkuExists. */
  public CreateSKUResponse createSku(CreateSKURequest request) {
    return unary(StockServiceGrpc.getCreateSKUMethod(), request, false, null);
  }

  /** Creates a SKU of total units in segments, initialFill of them in the segments. */
  public CreateSKUResponse createSku(String sku, long total, int segments, long initialFill) {
    return createSku(CreateSKURequest.newBuilder().setSku(sku).setTotal(total).setSegments(segments).setInitialFill(initialFill).build());
  }

  /** Takes units for an order, final at once. Throws SoldOut, PerUserLimitExceeded, OrderConflict... */
  public AllocateResponse allocate(AllocateRequest request) {
    return unary(StockServiceGrpc.getAllocateMethod(), request, true, null);
  }

  public AllocateResponse allocate(String sku, String order, long qty) {
    return allocate(AllocateRequest.newBuilder().setSku(sku).setOrder(order).setQty(qty).build());
  }

  /** Holds units until confirm, for at most the request's ttl. */
  public ReserveResponse reserve(ReserveRequest request) {
    return unary(StockServiceGrpc.getReserveMethod(), request, true, null);
  }

  public ReserveResponse reserve(String sku, String order, long qty, Duration ttl) {
    return reserve(ReserveRequest.newBuilder().setSku(sku).setOrder(order).setQty(qty).setTtl(duration(ttl)).build());
  }

  /** A line of an order of several SKUs: qty units of sku. */
  public static OrderLine line(String sku, long qty) {
    return OrderLine.newBuilder().setSku(sku).setQty(qty).build();
  }

  /**
   * Takes every line of an order of several SKUs (each SKU once), or none, in one transaction,
   * under one order ID. A refusal is SoldOut (or PerUserLimitExceeded) naming the line that could
   * not be served: {@link StockctlException#refusedLine()} ({@code index} in the request's lines,
   * {@code sku}, {@code qty}); nothing was taken. Retried like allocate: a retry with the same lines
   * replays the whole first outcome; other lines are OrderConflict. confirm, cancel and release with
   * any line's SKU act on the whole order.
   */
  public AllocateOrderResponse allocateOrder(AllocateOrderRequest request) {
    return unary(StockServiceGrpc.getAllocateOrderMethod(), request, true, null);
  }

  /** allocateOrder of these lines: {@code client.allocateOrder("cart-1", line("iphone", 1), line("case", 1))}. */
  public AllocateOrderResponse allocateOrder(String order, OrderLine... lines) {
    return allocateOrder(AllocateOrderRequest.newBuilder().setOrder(order).addAllLines(List.of(lines)).build());
  }

  /** allocateOrder of these lines for a buyer (required on SKUs with a per-user limit). */
  public AllocateOrderResponse allocateOrder(String order, String buyer, List<OrderLine> lines) {
    return allocateOrder(AllocateOrderRequest.newBuilder().setOrder(order).setBuyer(buyer).addAllLines(lines).build());
  }

  /**
   * allocateOrder as a reservation of every line, with one deadline: until confirm of any line's
   * SKU, for at most the request's ttl; unconfirmed, every line expires together. The same refusals.
   */
  public ReserveOrderResponse reserveOrder(ReserveOrderRequest request) {
    return unary(StockServiceGrpc.getReserveOrderMethod(), request, true, null);
  }

  /** reserveOrder of these lines for ttl. */
  public ReserveOrderResponse reserveOrder(String order, Duration ttl, OrderLine... lines) {
    return reserveOrder(ReserveOrderRequest.newBuilder().setOrder(order).setTtl(duration(ttl)).addAllLines(List.of(lines)).build());
  }

  /** reserveOrder of these lines for ttl, for a buyer. */
  public ReserveOrderResponse reserveOrder(String order, String buyer, Duration ttl, List<OrderLine> lines) {
    return reserveOrder(ReserveOrderRequest.newBuilder().setOrder(order).setBuyer(buyer).setTtl(duration(ttl)).addAllLines(lines).build());
  }

  /** Makes a reservation final. Throws ReservationExpired, OrderStateConflict. */
  public ConfirmResponse confirm(String sku, String order) {
    return unary(StockServiceGrpc.getConfirmMethod(), ConfirmRequest.newBuilder().setSku(sku).setOrder(order).build(), true, null);
  }

  /** Gives a live reservation's units back. */
  public CancelResponse cancel(String sku, String order) {
    return unary(StockServiceGrpc.getCancelMethod(), CancelRequest.newBuilder().setSku(sku).setOrder(order).build(), true, null);
  }

  /** Gives an order's units back. */
  public ReleaseResponse release(String sku, String order) {
    return unary(StockServiceGrpc.getReleaseMethod(), ReleaseRequest.newBuilder().setSku(sku).setOrder(order).build(), true, null);
  }

  /** Adds a delivery to the pool, idempotent by the delivery ID. */
  public RestockResponse restock(String sku, long qty, String delivery) {
    return unary(StockServiceGrpc.getRestockMethod(),
        RestockRequest.newBuilder().setSku(sku).setQty(qty).setDelivery(delivery).build(), true, null);
  }

  /** The SKU's stock at one etcd revision. */
  public StockStatus status(String sku) {
    return unary(StockServiceGrpc.getStatusMethod(), StatusRequest.newBuilder().setSku(sku).build(), true, null).getStatus();
  }

  /** Checks the books; ok is false (with problems) when they do not balance. */
  public AuditResponse audit(String sku) {
    return unary(StockServiceGrpc.getAuditMethod(), AuditRequest.newBuilder().setSku(sku).build(), true, null);
  }

  /** The SKU's stock now, then after changes; ends (hasNext false) at the deadline. Close it to stop. */
  public ServerStream<WatchStatusResponse> watchStatus(WatchStatusRequest request, Duration deadline) {
    return stream(StockServiceGrpc.getWatchStatusMethod(), request, deadline);
  }

  /**
   * The order feed's batches (events, cursor, snapshot) after request.since; ends (hasNext false) at
   * the deadline; throws CursorCompacted, CursorAhead, Unavailable... For a consumer that stores its
   * cursor with what it applies, use {@link OrderFeedConsumer}.
   */
  public ServerStream<WatchOrdersResponse> watchOrders(WatchOrdersRequest request, Duration deadline) {
    return stream(StockServiceGrpc.getWatchOrdersMethod(), request, deadline);
  }

  private <Q, A> ServerStream<A> stream(MethodDescriptor<Q, A> method, Q request, Duration deadline) {
    CallOptions o = CallOptions.DEFAULT;
    if (deadline != null) {
      o = o.withDeadlineAfter(deadline.toMillis(), TimeUnit.MILLISECONDS);
    }
    ClientCall<Q, A> call = channel(target()).newCall(method, o);
    return new ServerStream<>(call, ClientCalls.blockingServerStreamingCall(call, request));
  }

  /** A server stream: an Iterator whose errors are StockctlExceptions; close() cancels it. */
  public static final class ServerStream<A> implements Iterator<A>, AutoCloseable {
    private final ClientCall<?, A> call;
    private final Iterator<A> it;
    private volatile boolean closed;

    ServerStream(ClientCall<?, A> call, Iterator<A> it) {
      this.call = call;
      this.it = it;
    }

    @Override
    public boolean hasNext() {
      try {
        return it.hasNext();
      } catch (StatusRuntimeException sre) {
        io.grpc.Status.Code c = sre.getStatus().getCode();
        // the caller's deadline or close(): "no more now", as the server's OK at the deadline
        if (c == io.grpc.Status.Code.DEADLINE_EXCEEDED || (closed && c == io.grpc.Status.Code.CANCELLED)) {
          return false;
        }
        throw StockctlException.from(sre);
      }
    }

    @Override
    public A next() {
      if (!hasNext()) {
        throw new NoSuchElementException();
      }
      return it.next();
    }

    @Override
    public void close() {
      closed = true;
      call.cancel("closed by the caller", null);
    }
  }

  /**
   * Readies the server this client reaches to sell skus shortly before their sale opens: its first
   * order of each then writes one key, its record. It prepares that one serve process (call it on
   * each that will sell). An invalid name throws InvalidArgument, an unknown SKU SkuNotFound, and
   * nothing is done.
   */
  public PrepareResponse prepare(List<String> skus) {
    return unary(StockServiceGrpc.getPrepareMethod(), PrepareRequest.newBuilder().addAllSkus(skus).build(), true, null);
  }

  /**
   * The earliest deadline among sku's live (unconfirmed) reservations, or empty when none is live:
   * when units they hold may come back to the SKU (the rebalancer expires a reservation normally
   * well within a second of its deadline), so that a buyer refused with SoldOut can be told whether
   * to look again, and when. One read of the reservation index, not a status(). An invalid name
   * throws InvalidArgument, an unknown SKU SkuNotFound.
   */
  public Optional<Instant> nextExpiry(String sku) {
    NextExpiryResponse r = unary(StockServiceGrpc.getNextExpiryMethod(), NextExpiryRequest.newBuilder().setSku(sku).build(), true, null);
    if (!r.getLive()) {
      return Optional.empty();
    }
    return Optional.of(Instant.ofEpochSecond(r.getDeadline().getSeconds(), r.getDeadline().getNanos()));
  }

  /** Every SKU whose creation has completed, in name order, read pageSize at a time (0: the server's 100). */
  public List<String> listSkus(int pageSize) {
    List<String> all = new ArrayList<>();
    String token = "";
    do {
      ListSKUsResponse page = unary(StockServiceGrpc.getListSKUsMethod(),
          ListSKUsRequest.newBuilder().setPageSize(pageSize).setPageToken(token).build(), true, null);
      all.addAll(page.getSkusList());
      token = page.getNextPageToken();
    } while (!token.isEmpty());
    return all;
  }

  /**
   * Every SKU with the etcd cluster that holds it, in name order, read pageSize at a time (0: the
   * server's 100); the cluster is "" on a server of one cluster.
   */
  public java.util.LinkedHashMap<String, String> listSkuClusters(int pageSize) {
    java.util.LinkedHashMap<String, String> all = new java.util.LinkedHashMap<>();
    String token = "";
    do {
      ListSKUsResponse page = unary(StockServiceGrpc.getListSKUsMethod(),
          ListSKUsRequest.newBuilder().setPageSize(pageSize).setPageToken(token).build(), true, null);
      for (int i = 0; i < page.getSkusCount(); i++) {
        all.put(page.getSkus(i), i < page.getClustersCount() ? page.getClusters(i) : "");
      }
      token = page.getNextPageToken();
    } while (!token.isEmpty());
    return all;
  }

  /**
   * Many Allocate and Reserve orders on one stream, each answered on its own (a future); orders
   * not answered when the stream breaks are sent again with the same order IDs on a new stream:
   *
   * <pre>{@code
   * try (OrderStream orders = client.orderStream()) {
   *   futures.add(orders.allocate("iphone", "o-1", 1));
   * }   // close() waits for every answer
   * }</pre>
   */
  public OrderStream orderStream() {
    return new OrderStream(this);
  }

  // -- LockService -------------------------------------------------------

  /**
   * A lock held over the Hold stream, kept alive in the background:
   *
   * <pre>{@code
   * try (Lock held = client.lock("nightly-report", Duration.ofSeconds(30))) {
   *   write(held.token());
   *   held.check();   // throws LockLost if it was lost meanwhile
   * }                 // close() releases it, or throws LockLost if it was lost
   * }</pre>
   */
  public Lock lock(String name, Duration ttl) {
    return lock(HoldAcquire.newBuilder().setName(name).setTtl(duration(ttl)).build(), null);
  }

  /** A lock, shared hold or semaphore permit (acquire's kind, limit, wait); onLost is called when it is lost. */
  public Lock lock(HoldAcquire acquire, Consumer<StockctlException.LockLost> onLost) {
    return Lock.acquire(this, acquire, onLost);
  }

  /**
   * The unary shape: a hold kept by keepAlive at least every ttl, on the same server. The request
   * carries a request_id (a random one unless set): an attempt whose answer was lost is retried with
   * it, on the same server, and answers the hold it was granted ({@code replayed}).
   */
  public AcquireResponse acquire(AcquireRequest request) {
    Duration d = null;
    if (request.hasWait()) {
      d = timeout.plusSeconds(request.getWait().getSeconds());
    }
    if (request.getRequestId().isEmpty()) {
      request = request.toBuilder().setRequestId("java-" + java.util.UUID.randomUUID()).build();
    }
    return unary(LockServiceGrpc.getAcquireMethod(), request, true, d, target());
  }

  public AcquireResponse acquire(String name, LockKind kind, Duration ttl) {
    return acquire(AcquireRequest.newBuilder().setName(name).setKind(kind).setTtl(duration(ttl)).build());
  }

  public KeepAliveResponse keepAlive(String holdId) {
    return unary(LockServiceGrpc.getKeepAliveMethod(), KeepAliveRequest.newBuilder().setHoldId(holdId).build(), false, null);
  }

  public LockServiceReleaseResponse releaseHold(String holdId) {
    return unary(LockServiceGrpc.getReleaseMethod(), LockServiceReleaseRequest.newBuilder().setHoldId(holdId).build(), false, null);
  }

  /** Releases the hold an Acquire with this request_id was granted, or withdraws it ({@code withdrawn}). */
  public LockServiceReleaseResponse releaseByRequestId(String requestId) {
    return unary(LockServiceGrpc.getReleaseMethod(), LockServiceReleaseRequest.newBuilder().setRequestId(requestId).build(), false, null);
  }

  /** A google.protobuf.Duration of a java.time.Duration. */
  public static com.google.protobuf.Duration duration(Duration d) {
    return com.google.protobuf.Duration.newBuilder().setSeconds(d.getSeconds()).setNanos(d.getNano()).build();
  }
}
