package com.github.stockctl.client;

import com.github.stockctl.v1.HoldAcquire;
import com.github.stockctl.v1.HoldAcquired;
import com.github.stockctl.v1.HoldKeepAlive;
import com.github.stockctl.v1.HoldRelease;
import com.github.stockctl.v1.HoldRequest;
import com.github.stockctl.v1.HoldResponse;
import com.github.stockctl.v1.LockServiceGrpc;
import com.github.stockctl.v1.LockLost;
import io.grpc.CallOptions;
import io.grpc.ClientCall;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.ClientCalls;
import io.grpc.stub.StreamObserver;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;

/**
 * A lock, a shared hold or a semaphore permit held over one Hold stream, kept alive (every ttl/3)
 * from a background thread until close().
 *
 * <p>{@link #token()} is the fencing token: pass it with every write the lock protects. When the
 * hold is lost (the server says so, or the stream breaks) {@link #isLost()} turns true, the onLost
 * callback runs, {@link #check()} throws {@link StockctlException.LockLost}, and so does close().
 */
public final class Lock implements AutoCloseable {
  private final String name;
  private final Consumer<StockctlException.LockLost> onLost;
  private final CompletableFuture<HoldAcquired> acquired = new CompletableFuture<>();
  private final CountDownLatch done = new CountDownLatch(1);
  private final CountDownLatch lostLatch = new CountDownLatch(1);
  private final ScheduledExecutorService ticker;
  private ClientCall<HoldRequest, HoldResponse> call;
  private StreamObserver<HoldRequest> requests;
  private volatile boolean released;
  private volatile StockctlException.LockLost lost;
  private HoldAcquired hold;
  private final Duration closeTimeout;

  private Lock(String name, Consumer<StockctlException.LockLost> onLost, Duration closeTimeout) {
    this.name = name;
    this.onLost = onLost;
    this.closeTimeout = closeTimeout;
    this.ticker = Executors.newSingleThreadScheduledExecutor(r -> {
      Thread t = new Thread(r, "stockctl-lock-keepalive-" + name);
      t.setDaemon(true);
      return t;
    });
  }

  static Lock acquire(StockctlClient client, HoldAcquire acquire, Consumer<StockctlException.LockLost> onLost) {
    Lock l = new Lock(acquire.getName(), onLost, client.timeout);
    l.call = client.channel(client.target()).newCall(LockServiceGrpc.getHoldMethod(), CallOptions.DEFAULT);
    l.requests = ClientCalls.asyncBidiStreamingCall(l.call, l.new Reader());
    l.send(HoldRequest.newBuilder().setAcquire(acquire).build());
    try {
      l.hold = l.acquired.get();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      l.call.cancel("interrupted", e);
      l.ticker.shutdownNow();
      throw StockctlException.from(io.grpc.Status.Code.CANCELLED, "interrupted while acquiring " + acquire.getName(), null, e);
    } catch (ExecutionException e) {
      l.ticker.shutdownNow();
      throw (StockctlException) e.getCause();
    }
    long every = Math.max(1, l.ttl().toMillis() / 3);
    l.ticker.scheduleAtFixedRate(() -> l.send(HoldRequest.newBuilder().setKeepAlive(HoldKeepAlive.getDefaultInstance()).build()),
        every, every, TimeUnit.MILLISECONDS);
    return l;
  }

  private synchronized void send(HoldRequest r) {
    if (done.getCount() == 0) {
      return;
    }
    try {
      requests.onNext(r);
    } catch (RuntimeException ignored) {
      // the stream ended: the reader reports it
    }
  }

  private final class Reader implements StreamObserver<HoldResponse> {
    @Override
    public void onNext(HoldResponse r) {
      switch (r.getEventCase()) {
        case ACQUIRED:
          acquired.complete(r.getAcquired());
          break;
        case RELEASED:
          released = true;
          break;
        case LOST:
          LockLost m = r.getLost();
          StockctlException e = StockctlException.from(io.grpc.Status.Code.FAILED_PRECONDITION, m.getMessage(),
              com.github.stockctl.client.rpc.Status.newBuilder().setMessage(m.getMessage())
                  .addDetails(com.google.protobuf.Any.newBuilder().setTypeUrl("type.googleapis.com/google.rpc.ErrorInfo")
                      .setValue(com.github.stockctl.client.rpc.ErrorInfo.newBuilder()
                          .setReason("LOCK_LOST").setDomain("stockctl").build().toByteString()))
                  .addDetails(com.google.protobuf.Any.pack(m, "type.googleapis.com")).build().toByteArray(), null);
          lose((StockctlException.LockLost) e);
          break;
        default:
          break;
      }
    }

    @Override
    public void onError(Throwable t) {
      StockctlException e = t instanceof StatusRuntimeException
          ? StockctlException.from((StatusRuntimeException) t)
          : StockctlException.from(io.grpc.Status.fromThrowable(t).getCode(), String.valueOf(t.getMessage()), null, t);
      if (!acquired.isDone()) {
        acquired.completeExceptionally(e);
      } else if (!released) {
        lose(e instanceof StockctlException.LockLost ? (StockctlException.LockLost) e
            : StockctlException.streamBroken(name, hold.getToken(), "the Hold stream broke (" + e.code + ": " + e.getMessage() + ")"));
      }
      finish();
    }

    @Override
    public void onCompleted() {
      if (!acquired.isDone()) {
        acquired.completeExceptionally(StockctlException.from(io.grpc.Status.Code.INTERNAL, "the Hold stream ended without an answer", null, null));
      } else if (!released) {
        lose(StockctlException.streamBroken(name, hold.getToken(), "the Hold stream ended before release"));
      }
      finish();
    }
  }

  private void finish() {
    synchronized (this) {
      done.countDown();
    }
    ticker.shutdownNow();
  }

  private void lose(StockctlException.LockLost e) {
    synchronized (this) {
      if (lost != null) {
        return;
      }
      lost = e;
    }
    lostLatch.countDown();
    if (onLost != null) {
      try {
        onLost.accept(e);
      } catch (RuntimeException ignored) {
        // a callback's failure must not hide the loss
      }
    }
  }

  public String name() {
    return name;
  }

  /** The fencing token: larger for every hold of the name than for any before it. */
  public long token() {
    return hold.getToken();
  }

  /** The hold's etcd key, for callers that fence their own etcd transactions. */
  public String key() {
    return hold.getKey();
  }

  /** The key's create revision. */
  public long revision() {
    return hold.getRevision();
  }

  public Duration ttl() {
    Duration d = Duration.ofSeconds(hold.getTtl().getSeconds(), hold.getTtl().getNanos());
    return d.isZero() ? Duration.ofSeconds(15) : d;
  }

  public boolean isLost() {
    return lost != null;
  }

  /** The LockLost, or null while held. */
  public StockctlException.LockLost lostError() {
    return lost;
  }

  /** Waits up to d for a loss; true if it was lost. */
  public boolean awaitLost(Duration d) throws InterruptedException {
    return lostLatch.await(d.toMillis(), TimeUnit.MILLISECONDS);
  }

  /** Throws LockLost if the hold was lost. */
  public void check() {
    StockctlException.LockLost e = lost;
    if (e != null) {
      throw e;
    }
  }

  /** Stops sending keep-alives (as a stalled process would): for tests. */
  void stopKeepAlives() {
    ticker.shutdownNow();
  }

  /** Releases the hold and waits for the server's answer; throws LockLost if it had been lost. */
  @Override
  public void close() {
    ticker.shutdownNow();
    if (done.getCount() > 0) {
      send(HoldRequest.newBuilder().setRelease(HoldRelease.getDefaultInstance()).build());
      try {
        if (!done.await(closeTimeout.toMillis(), TimeUnit.MILLISECONDS)) {
          call.cancel("release not answered", null);
          done.await();
        }
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        call.cancel("interrupted", e);
      }
      synchronized (this) {
        try {
          requests.onCompleted();
        } catch (RuntimeException ignored) {
          // already ended
        }
      }
    }
    check();
  }
}
