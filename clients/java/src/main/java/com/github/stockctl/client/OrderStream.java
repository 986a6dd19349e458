package com.github.stockctl.client;

import com.github.stockctl.client.rpc.Status;
import com.github.stockctl.v1.AllocateRequest;
import com.github.stockctl.v1.AllocateResponse;
import com.github.stockctl.v1.OrderError;
import com.github.stockctl.v1.OrderStreamRequest;
import com.github.stockctl.v1.OrderStreamResponse;
import com.github.stockctl.v1.ReserveRequest;
import com.github.stockctl.v1.ReserveResponse;
import com.github.stockctl.v1.StockServiceGrpc;
import io.grpc.CallOptions;
import io.grpc.ClientCall;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.ClientCalls;
import io.grpc.stub.StreamObserver;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

/**
 * Many Allocate and Reserve orders on one OrderStream call, each answered on its own: {@link
 * #allocate} and {@link #reserve} send an order at once and return a future of its answer, or of
 * its exception (SoldOut, PerUserLimitExceeded..., as the unary call would throw). If the stream
 * breaks, the orders not yet answered are sent again, with the same order IDs, on a new stream to
 * the client's next target: those that had been committed answer {@code replayed}. close() waits
 * for every answer and ends the stream.
 */
public final class OrderStream implements AutoCloseable {
  private final StockctlClient client;
  private final Map<Long, Entry> pending = new LinkedHashMap<>();
  private final ScheduledExecutorService retries;
  private long nextId = 1;
  private int failures;
  private boolean closed;
  private Stream current; // null: none open (the next order opens one)

  private static final class Entry {
    final OrderStreamRequest request;
    final CompletableFuture<Object> future = new CompletableFuture<>();

    Entry(OrderStreamRequest request) {
      this.request = request;
    }
  }

  /** One call, and what it reads. */
  private final class Stream implements StreamObserver<OrderStreamResponse> {
    final int target;
    final ClientCall<OrderStreamRequest, OrderStreamResponse> call;
    StreamObserver<OrderStreamRequest> requests;

    Stream(int target) {
      this.target = target;
      this.call = client.channel(target).newCall(StockServiceGrpc.getOrderStreamMethod(), CallOptions.DEFAULT);
    }

    @Override
    public void onNext(OrderStreamResponse msg) {
      // A message carries its own answer (when it has an outcome) and those
      // in `more`, ready at the same moment.
      if (msg.getOutcomeCase() != OrderStreamResponse.OutcomeCase.OUTCOME_NOT_SET) {
        answer(msg);
      }
      for (OrderStreamResponse r : msg.getMoreList()) {
        answer(r);
      }
    }

    private void answer(OrderStreamResponse r) {
      Entry e;
      synchronized (OrderStream.this) {
        e = pending.remove(r.getId());
        failures = 0;
        OrderStream.this.notifyAll();
      }
      if (e == null) {
        return;
      }
      switch (r.getOutcomeCase()) {
        case ALLOCATED:
          e.future.complete(r.getAllocated());
          break;
        case RESERVED:
          e.future.complete(r.getReserved());
          break;
        case ERROR:
          e.future.completeExceptionally(fromOrderError(r.getError()));
          break;
        default:
          e.future.completeExceptionally(StockctlException.from(io.grpc.Status.Code.INTERNAL, "an answer without an outcome", null, null));
      }
    }

    @Override
    public void onError(Throwable t) {
      ended(this, t instanceof StatusRuntimeException ? StockctlException.from((StatusRuntimeException) t)
          : StockctlException.from(io.grpc.Status.fromThrowable(t).getCode(), String.valueOf(t.getMessage()), null, t));
    }

    @Override
    public void onCompleted() {
      ended(this, null);
    }
  }

  OrderStream(StockctlClient client) {
    this.client = client;
    this.retries = Executors.newSingleThreadScheduledExecutor(r -> {
      Thread t = new Thread(r, "stockctl-orderstream-retry");
      t.setDaemon(true);
      return t;
    });
  }

  /** A new stream on the current target, with every unanswered order sent again (holding the monitor). */
  private void open() {
    Stream s = new Stream(client.target());
    s.requests = ClientCalls.asyncBidiStreamingCall(s.call, s);
    current = s;
    for (Entry e : pending.values()) {
      s.requests.onNext(e.request);
    }
  }

  private void ended(Stream s, StockctlException err) {
    List<Entry> fail = new ArrayList<>();
    synchronized (this) {
      if (current != s) {
        return; // a newer stream took over
      }
      if (pending.isEmpty()) {
        // nothing to answer: the next order opens a new stream (on the next target if this one broke)
        current = null;
        if (err != null && err.retryable()) {
          client.failover(s.target);
        }
        notifyAll();
        return;
      }
      if (err == null) {
        err = StockctlException.from(io.grpc.Status.Code.UNAVAILABLE, "the order stream ended with orders unanswered", null, null);
      }
      failures++;
      if (!err.retryable() || failures >= client.attempts) {
        fail.addAll(pending.values());
        pending.clear();
        current = null;
        failures = 0;
        notifyAll();
      } else {
        client.failover(s.target);
        current = null;
        retries.schedule(this::reopen, client.delayMillis(failures, err), TimeUnit.MILLISECONDS);
      }
    }
    for (Entry e : fail) {
      e.future.completeExceptionally(err);
    }
  }

  private synchronized void reopen() {
    if (current == null && !pending.isEmpty()) {
      open();
    }
  }

  @SuppressWarnings("unchecked")
  private synchronized <T> CompletableFuture<T> send(OrderStreamRequest.Builder b) {
    if (closed) {
      throw new IllegalStateException("the order stream is closed");
    }
    Entry e = new Entry(b.setId(nextId++).build());
    pending.put(e.request.getId(), e);
    if (current == null) {
      if (failures == 0) {
        open(); // sends every pending order, this one included
      } // else a retry is scheduled: it sends this one too
    } else {
      current.requests.onNext(e.request);
    }
    return (CompletableFuture<T>) (CompletableFuture<?>) e.future;
  }

  /** Sends an Allocate; the future completes with its answer or its StockctlException. */
  public CompletableFuture<AllocateResponse> allocate(AllocateRequest r) {
    return send(OrderStreamRequest.newBuilder().setAllocate(r));
  }

  public CompletableFuture<AllocateResponse> allocate(String sku, String order, long qty) {
    return allocate(AllocateRequest.newBuilder().setSku(sku).setOrder(order).setQty(qty).build());
  }

  /** Sends a Reserve; the future completes with its answer or its StockctlException. */
  public CompletableFuture<ReserveResponse> reserve(ReserveRequest r) {
    return send(OrderStreamRequest.newBuilder().setReserve(r));
  }

  /** Whether a stream is open now (false after a break, until the next order): for tests. */
  synchronized boolean streaming() {
    return current != null;
  }

  /** Waits for every order's answer, then ends the stream. */
  @Override
  public void close() {
    synchronized (this) {
      closed = true;
      while (!pending.isEmpty()) {
        try {
          wait();
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          break;
        }
      }
      if (current != null) {
        try {
          current.requests.onCompleted();
        } catch (RuntimeException ignored) {
          // already ended
        }
      }
    }
    retries.shutdownNow();
  }

  /** The exception of one order's error in an OrderStream answer. */
  public static StockctlException fromOrderError(OrderError oe) {
    io.grpc.Status.Code code;
    try {
      code = io.grpc.Status.Code.valueOf(oe.getCode().toUpperCase(Locale.ROOT).replace("CANCELED", "CANCELLED"));
    } catch (IllegalArgumentException e) {
      code = io.grpc.Status.Code.UNKNOWN;
    }
    byte[] st = Status.newBuilder().setMessage(oe.getMessage()).addAllDetails(oe.getDetailsList()).build().toByteArray();
    return StockctlException.from(code, oe.getMessage(), st, null);
  }
}
