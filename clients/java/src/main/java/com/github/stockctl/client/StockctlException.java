package com.github.stockctl.client;

import com.github.stockctl.client.rpc.BadRequest;
import com.github.stockctl.client.rpc.ErrorInfo;
import com.github.stockctl.client.rpc.RetryInfo;
import com.google.protobuf.Any;
import com.google.protobuf.ByteString;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.protobuf.Message;
import com.google.protobuf.Parser;
import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.time.Instant;
import java.util.Collections;
import java.util.HashMap;
import java.util.Map;
import java.util.function.Function;

/**
 * An error of stockctl serve (or of gRPC on the way), as the class of its reason.
 *
 * <p>Every stockctl error carries a gRPC code, a message and, in the {@code grpc-status-details-bin}
 * trailer, a {@code google.rpc.Status} whose details hold a {@code google.rpc.ErrorInfo} (domain
 * {@code stockctl}) with the reason, plus typed details ({@code stockctl.v1.InsufficientStock}...).
 * {@link #from} maps them to one nested class per reason, with the detail's fields:
 *
 * <pre>{@code
 * try {
 *   client.allocate("iphone", "o-1", 2);
 * } catch (StockctlException.SoldOut e) {
 *   System.out.println(e.remaining + " left at revision " + e.revision);
 * }
 * }</pre>
 *
 * The classes group under a class per gRPC code ({@link NotFound}, {@link Conflict}, {@link
 * FailedPrecondition}, {@link Unavailable}...); an error without an ErrorInfo becomes that class.
 */
public class StockctlException extends RuntimeException {
  private static final long serialVersionUID = 1L;
  private static final String PREFIX = "type.googleapis.com/";
  private static final Metadata.Key<byte[]> DETAILS =
      Metadata.Key.of("grpc-status-details-bin", Metadata.BINARY_BYTE_MARSHALLER);

  /** The gRPC code. */
  public final Status.Code code;
  /** The ErrorInfo's reason, e.g. "INSUFFICIENT_STOCK"; "" for a transport error. */
  public final String reason;
  /** The ErrorInfo's metadata. */
  public final Map<String, String> metadata;
  /** A google.rpc.RetryInfo's delay, or null. */
  public final Duration retryDelay;
  /** The field a google.rpc.BadRequest (or the metadata's "field") names, or null. */
  public final String field;
  /** Each detail's bytes by full type name. */
  public final Map<String, ByteString> details;

  /** What an exception is made of. */
  protected static final class Info {
    final Status.Code code;
    final String message;
    final String reason;
    final Map<String, String> metadata;
    final Map<String, ByteString> details;
    final Duration retryDelay;
    final String field;
    final Throwable cause;

    Info(Status.Code code, String message, String reason, Map<String, String> metadata,
        Map<String, ByteString> details, Duration retryDelay, String field, Throwable cause) {
      this.code = code;
      this.message = message;
      this.reason = reason;
      this.metadata = metadata;
      this.details = details;
      this.retryDelay = retryDelay;
      this.field = field;
      this.cause = cause;
    }

    <T extends Message> T detail(Parser<T> parser, String name) {
      ByteString raw = details.get(name);
      if (raw == null) {
        return null;
      }
      try {
        return parser.parseFrom(raw);
      } catch (InvalidProtocolBufferException e) {
        return null;
      }
    }
  }

  protected StockctlException(Info i) {
    super(i.message, i.cause);
    this.code = i.code;
    this.reason = i.reason;
    this.metadata = Collections.unmodifiableMap(i.metadata);
    this.details = Collections.unmodifiableMap(i.details);
    this.retryDelay = i.retryDelay;
    this.field = i.field;
  }

  /**
   * The line of an order of several SKUs (allocateOrder, reserveOrder) that was refused: its {@code
   * index} in the request's lines (from 0), {@code sku} and {@code qty}; null for any other error. It
   * comes with SoldOut and PerUserLimitExceeded, whose fields are that line's SKU's.
   */
  public com.github.stockctl.v1.RefusedLine refusedLine() {
    ByteString raw = details.get("stockctl.v1.RefusedLine");
    if (raw == null) {
      return null;
    }
    try {
      return com.github.stockctl.v1.RefusedLine.parseFrom(raw);
    } catch (InvalidProtocolBufferException e) {
      return null;
    }
  }

  /** Whether the client retries this error with the same request. */
  public boolean retryable() {
    return code == Status.Code.UNAVAILABLE
        || code == Status.Code.CANCELLED
        || code == Status.Code.DEADLINE_EXCEEDED
        || reason.equals("OVERLOADED")
        || reason.equals("CONTENTION");
  }

  /** The exception of a failed call. */
  public static StockctlException from(StatusRuntimeException e) {
    Metadata trailers = e.getTrailers();
    byte[] raw = trailers == null ? null : trailers.get(DETAILS);
    return from(e.getStatus().getCode(), e.getStatus().getDescription(), raw, e);
  }

  /** The exception of a gRPC status: its code, message and grpc-status-details-bin bytes (or null). */
  public static StockctlException from(Status.Code code, String message, byte[] statusBytes, Throwable cause) {
    Map<String, ByteString> details = new HashMap<>();
    if (statusBytes != null) {
      try {
        com.github.stockctl.client.rpc.Status st = com.github.stockctl.client.rpc.Status.parseFrom(statusBytes);
        if (!st.getMessage().isEmpty()) {
          message = st.getMessage();
        }
        for (Any d : st.getDetailsList()) {
          String url = d.getTypeUrl();
          details.put(url.startsWith(PREFIX) ? url.substring(PREFIX.length()) : url.substring(url.lastIndexOf('/') + 1), d.getValue());
        }
      } catch (InvalidProtocolBufferException ignored) {
        // a status that does not decode: the code and message are all there is
      }
    }
    String reason = "";
    Map<String, String> metadata = new HashMap<>();
    Duration retryDelay = null;
    String field = null;
    try {
      if (details.containsKey("google.rpc.ErrorInfo")) {
        ErrorInfo info = ErrorInfo.parseFrom(details.get("google.rpc.ErrorInfo"));
        if (info.getDomain().isEmpty() || info.getDomain().equals("stockctl")) {
          reason = info.getReason();
          metadata.putAll(info.getMetadataMap());
        }
      }
      if (details.containsKey("google.rpc.RetryInfo")) {
        com.google.protobuf.Duration d = RetryInfo.parseFrom(details.get("google.rpc.RetryInfo")).getRetryDelay();
        retryDelay = Duration.ofSeconds(d.getSeconds(), d.getNanos());
      }
      if (details.containsKey("google.rpc.BadRequest")) {
        BadRequest br = BadRequest.parseFrom(details.get("google.rpc.BadRequest"));
        if (br.getFieldViolationsCount() > 0) {
          field = br.getFieldViolations(0).getField();
        }
      }
    } catch (InvalidProtocolBufferException ignored) {
      // keep what decoded
    }
    if (metadata.containsKey("field")) {
      field = metadata.get("field");
    }
    Info i = new Info(code, message == null ? "" : message, reason, metadata, details, retryDelay, field, cause);
    Function<Info, StockctlException> make = BY_REASON.get(reason);
    if (make == null) {
      make = BY_CODE.getOrDefault(code, StockctlException::new);
    }
    if (code == Status.Code.INVALID_ARGUMENT && (reason.isEmpty() || reason.equals("INVALID_ARGUMENT"))
        && "merged_since".equals(metadata.get("field")) && metadata.containsKey("cluster")) {
      make = MergedCursorRefused::new;
    }
    return make.apply(i);
  }

  /** A LockLost the client makes itself, when a Hold stream broke. */
  static LockLost streamBroken(String name, long token, String why) {
    Info i = new Info(Status.Code.UNAVAILABLE,
        "lock \"" + name + "\" (token " + token + ") was lost: " + why + "; another holder may have it now",
        "LOCK_LOST", new HashMap<>(), new HashMap<>(), null, null, null);
    return new LockLost(i, name, token, "STREAM_BROKEN");
  }

  /** The class of each ErrorInfo reason. */
  public static final Map<String, Function<Info, StockctlException>> BY_REASON = new HashMap<>();
  /** The class of an error without an ErrorInfo, by its gRPC code. */
  public static final Map<Status.Code, Function<Info, StockctlException>> BY_CODE = new HashMap<>();

  /** NOT_FOUND. */
  public static class NotFound extends StockctlException {
    private static final long serialVersionUID = 1L;

    protected NotFound(Info i) {
      super(i);
    }
  }

  /** ALREADY_EXISTS. */
  public static class Conflict extends StockctlException {
    private static final long serialVersionUID = 1L;

    protected Conflict(Info i) {
      super(i);
    }
  }

  /** FAILED_PRECONDITION. */
  public static class FailedPrecondition extends StockctlException {
    private static final long serialVersionUID = 1L;

    protected FailedPrecondition(Info i) {
      super(i);
    }
  }

  /** ABORTED. */
  public static class Aborted extends StockctlException {
    private static final long serialVersionUID = 1L;

    protected Aborted(Info i) {
      super(i);
    }
  }

  /** RESOURCE_EXHAUSTED. */
  public static class ResourceExhausted extends StockctlException {
    private static final long serialVersionUID = 1L;

    protected ResourceExhausted(Info i) {
      super(i);
    }
  }

  /** UNAUTHENTICATED. */
  public static class Unauthenticated extends StockctlException {
    private static final long serialVersionUID = 1L;

    protected Unauthenticated(Info i) {
      super(i);
    }
  }

  /** PERMISSION_DENIED. */
  public static class PermissionDenied extends StockctlException {
    private static final long serialVersionUID = 1L;

    protected PermissionDenied(Info i) {
      super(i);
    }
  }

  /** UNAVAILABLE. */
  public static class Unavailable extends StockctlException {
    private static final long serialVersionUID = 1L;

    protected Unavailable(Info i) {
      super(i);
    }
  }

  /** UNIMPLEMENTED. */
  public static class Unimplemented extends StockctlException {
    private static final long serialVersionUID = 1L;

    protected Unimplemented(Info i) {
      super(i);
    }
  }

  /** OUT_OF_RANGE. */
  public static class OutOfRange extends StockctlException {
    private static final long serialVersionUID = 1L;

    protected OutOfRange(Info i) {
      super(i);
    }
  }

  /** UNKNOWN. */
  public static class Unknown extends StockctlException {
    private static final long serialVersionUID = 1L;

    protected Unknown(Info i) {
      super(i);
    }
  }

  /** INVALID_ARGUMENT: a field is malformed or out of range; nothing changed ({@code field} names it). */
  public static class InvalidArgument extends StockctlException {
    private static final long serialVersionUID = 1L;

    protected InvalidArgument(Info i) {
      super(i);
    }
  }

  /** TOKEN_IN_URL: A credential in the URL's query. */
  public static class TokenInUrl extends InvalidArgument {
    private static final long serialVersionUID = 1L;

    protected TokenInUrl(Info i) {
      super(i);
    }
  }

  /**
   * CURSOR_AHEAD: WatchOrders' since is ahead of etcd's revision: start again with a snapshot. On a
   * merged feed (a serve over several clusters) {@code cluster} names the cluster and {@code cursor}
   * is its revision; null otherwise.
   */
  public static class CursorAhead extends InvalidArgument {
    private static final long serialVersionUID = 1L;
    public final long cursor;
    public final long revision;
    public final String cluster;

    protected CursorAhead(Info i) {
      super(i);
      com.github.stockctl.v1.CursorAhead d = i.detail(com.github.stockctl.v1.CursorAhead.parser(), "stockctl.v1.CursorAhead");
      this.cursor = d == null ? 0 : d.getCursor();
      this.revision = d == null ? 0 : d.getRevision();
      this.cluster = i.metadata.get("cluster");
    }
  }

  /**
   * A merged feed's cursor ({@code merged_since}) refused because of one cluster, named in {@code
   * cluster}: one the server does not have (another fleet's), or one removed from the fleet whose
   * order feed's end the cursor has not reached (or does not name): its events would be skipped. The
   * message says what to do (docs/deploy.md, removing a cluster). The server says INVALID_ARGUMENT on
   * field merged_since with the ErrorInfo metadata {@code cluster}; {@link #from} makes that this
   * class ({@code reason} stays "INVALID_ARGUMENT").
   */
  public static class MergedCursorRefused extends InvalidArgument {
    private static final long serialVersionUID = 1L;
    public final String cluster;

    protected MergedCursorRefused(Info i) {
      super(i);
      this.cluster = i.metadata.get("cluster");
    }
  }

  /** SKU_NOT_FOUND: No such SKU (or its creation has not completed). */
  public static class SkuNotFound extends NotFound {
    private static final long serialVersionUID = 1L;

    protected SkuNotFound(Info i) {
      super(i);
    }
  }

  /** ORDER_NOT_FOUND: No such order of this SKU. */
  public static class OrderNotFound extends NotFound {
    private static final long serialVersionUID = 1L;

    protected OrderNotFound(Info i) {
      super(i);
    }
  }

  /** HOLD_NOT_FOUND: No live hold with this ID on this server. */
  public static class HoldNotFound extends NotFound {
    private static final long serialVersionUID = 1L;

    protected HoldNotFound(Info i) {
      super(i);
    }
  }

  /** SKU_EXISTS: CreateSKU of an existing SKU. */
  public static class SkuExists extends Conflict {
    private static final long serialVersionUID = 1L;

    protected SkuExists(Info i) {
      super(i);
    }
  }

  /** ORDER_CONFLICT: The order ID was used with another SKU, qty, buyer or kind of order. */
  public static class OrderConflict extends Conflict {
    private static final long serialVersionUID = 1L;

    protected OrderConflict(Info i) {
      super(i);
    }
  }

  /** DELIVERY_CONFLICT: Restock's delivery ID was used with another SKU or qty; nothing added. */
  public static class DeliveryConflict extends Conflict {
    private static final long serialVersionUID = 1L;

    protected DeliveryConflict(Info i) {
      super(i);
    }
  }

  /** ORDER_STATE_CONFLICT: Confirm or Cancel of an order in a state that does not allow it. */
  public static class OrderStateConflict extends FailedPrecondition {
    private static final long serialVersionUID = 1L;

    protected OrderStateConflict(Info i) {
      super(i);
    }
  }

  /** INSUFFICIENT_STOCK: Sold out: the whole SKU held less than {@code want} ({@code remaining}) at {@code revision}; nothing deducted. */
  public static class SoldOut extends FailedPrecondition {
    private static final long serialVersionUID = 1L;
    public final String sku;
    public final long want;
    public final long remaining;
    public final long revision;

    protected SoldOut(Info i) {
      super(i);
      com.github.stockctl.v1.InsufficientStock d = i.detail(com.github.stockctl.v1.InsufficientStock.parser(), "stockctl.v1.InsufficientStock");
      this.sku = d == null ? "" : d.getSku();
      this.want = d == null ? 0 : d.getWant();
      this.remaining = d == null ? 0 : d.getRemaining();
      this.revision = d == null ? 0 : d.getRevision();
    }
  }

  /** PER_USER_LIMIT_EXCEEDED: The order would take the buyer past the SKU's per-user limit. */
  public static class PerUserLimitExceeded extends FailedPrecondition {
    private static final long serialVersionUID = 1L;
    public final String sku;
    public final String buyer;
    public final long limit;
    public final long held;
    public final long want;
    public final long revision;

    protected PerUserLimitExceeded(Info i) {
      super(i);
      com.github.stockctl.v1.PerUserLimitExceeded d = i.detail(com.github.stockctl.v1.PerUserLimitExceeded.parser(), "stockctl.v1.PerUserLimitExceeded");
      this.sku = d == null ? "" : d.getSku();
      this.buyer = d == null ? "" : d.getBuyer();
      this.limit = d == null ? 0 : d.getLimit();
      this.held = d == null ? 0 : d.getHeld();
      this.want = d == null ? 0 : d.getWant();
      this.revision = d == null ? 0 : d.getRevision();
    }
  }

  /** RESERVATION_EXPIRED: The reservation passed its deadline; its units went back. */
  public static class ReservationExpired extends FailedPrecondition {
    private static final long serialVersionUID = 1L;
    public final String sku;
    public final String order;
    public final java.time.Instant deadline;
    public final long revision;

    protected ReservationExpired(Info i) {
      super(i);
      com.github.stockctl.v1.ReservationExpired d = i.detail(com.github.stockctl.v1.ReservationExpired.parser(), "stockctl.v1.ReservationExpired");
      this.sku = d == null ? "" : d.getSku();
      this.order = d == null ? "" : d.getOrder();
      this.deadline = d == null || !d.hasDeadline() ? null : Instant.ofEpochSecond(d.getDeadline().getSeconds(), d.getDeadline().getNanos());
      this.revision = d == null ? 0 : d.getRevision();
    }
  }

  /** ORDER_PRUNED: The order was applied, then archived by prune, which keeps its ID for a retention (24 h by default): a retry is refused, never applied twice; {@code pruned} says when. */
  public static class OrderPruned extends FailedPrecondition {
    private static final long serialVersionUID = 1L;
    public final String sku;
    public final String order;
    public final java.time.Instant pruned;

    protected OrderPruned(Info i) {
      super(i);
      com.github.stockctl.v1.OrderPruned d = i.detail(com.github.stockctl.v1.OrderPruned.parser(), "stockctl.v1.OrderPruned");
      this.sku = d == null ? "" : d.getSku();
      this.order = d == null ? "" : d.getOrder();
      this.pruned = d == null || !d.hasPruned() ? null : Instant.ofEpochSecond(d.getPruned().getSeconds(), d.getPruned().getNanos());
    }
  }

  /** LOCK_LOST: The hold was lost ({@code lostReason}: SESSION_LOST, KEEPALIVE_TIMEOUT, SERVER_SHUTDOWN, or STREAM_BROKEN when the client saw its stream break); someone else may hold the lock now. */
  public static class LockLost extends FailedPrecondition {
    private static final long serialVersionUID = 1L;
    public final String name;
    public final long token;
    public final String lostReason;

    protected LockLost(Info i) {
      super(i);
      com.github.stockctl.v1.LockLost d = i.detail(com.github.stockctl.v1.LockLost.parser(), "stockctl.v1.LockLost");
      this.name = d == null ? "" : d.getName();
      this.token = d == null ? 0 : d.getToken();
      String why = i.metadata.getOrDefault("reason", "");
      if (d != null) {
        why = d.getReason().name();
      }
      this.lostReason = why.replace("LOST_REASON_", "");
    }

    LockLost(Info i, String name, long token, String lostReason) {
      super(i);
      this.name = name;
      this.token = token;
      this.lostReason = lostReason;
    }
  }

  /**
   * CURSOR_COMPACTED: WatchOrders' since is older than etcd's compacted history: start again with a
   * snapshot. On a merged feed (a serve over several clusters) {@code cluster} names the compacted
   * cluster and {@code cursor} is its revision; null otherwise.
   */
  public static class CursorCompacted extends FailedPrecondition {
    private static final long serialVersionUID = 1L;
    public final long cursor;
    public final long compactRevision;
    public final String cluster;

    protected CursorCompacted(Info i) {
      super(i);
      com.github.stockctl.v1.CursorCompacted d = i.detail(com.github.stockctl.v1.CursorCompacted.parser(), "stockctl.v1.CursorCompacted");
      this.cursor = d == null ? 0 : d.getCursor();
      this.compactRevision = d == null ? 0 : d.getCompactRevision();
      this.cluster = i.metadata.get("cluster");
    }
  }

  /** LIMIT_MISMATCH: A semaphore permit asked with another limit than its holders'. */
  public static class LimitMismatch extends FailedPrecondition {
    private static final long serialVersionUID = 1L;
    public final String name;
    public final int limit;
    public final int heldLimit;

    protected LimitMismatch(Info i) {
      super(i);
      com.github.stockctl.v1.LimitMismatch d = i.detail(com.github.stockctl.v1.LimitMismatch.parser(), "stockctl.v1.LimitMismatch");
      this.name = d == null ? "" : d.getName();
      this.limit = d == null ? 0 : d.getLimit();
      this.heldLimit = d == null ? 0 : d.getHeldLimit();
    }
  }

  /** LOCK_BUSY: The lock stayed held for the whole wait. */
  public static class LockBusy extends Aborted {
    private static final long serialVersionUID = 1L;
    public final String name;

    protected LockBusy(Info i) {
      super(i);
      com.github.stockctl.v1.LockBusy d = i.detail(com.github.stockctl.v1.LockBusy.parser(), "stockctl.v1.LockBusy");
      this.name = d == null ? "" : d.getName();
    }
  }

  /** CONTENTION: A commit kept losing to other writers for the whole deadline; nothing written. Retried. */
  public static class Contention extends Aborted {
    private static final long serialVersionUID = 1L;

    protected Contention(Info i) {
      super(i);
    }
  }

  /** OVERLOADED: The server is at its bound of calls in flight. Retried, on another server if any. */
  public static class Overloaded extends ResourceExhausted {
    private static final long serialVersionUID = 1L;

    protected Overloaded(Info i) {
      super(i);
    }
  }

  /** TOO_MANY_HOLDS: The server keeps its maximum of unary holds. */
  public static class TooManyHolds extends ResourceExhausted {
    private static final long serialVersionUID = 1L;

    protected TooManyHolds(Info i) {
      super(i);
    }
  }

  /** BODY_TOO_LARGE: The request is larger than the limit. */
  public static class BodyTooLarge extends ResourceExhausted {
    private static final long serialVersionUID = 1L;

    protected BodyTooLarge(Info i) {
      super(i);
    }
  }

  /** TOKEN_MISSING: No bearer token. */
  public static class TokenMissing extends Unauthenticated {
    private static final long serialVersionUID = 1L;

    protected TokenMissing(Info i) {
      super(i);
    }
  }

  /** TOKEN_INVALID: A token the server does not accept. */
  public static class TokenInvalid extends Unauthenticated {
    private static final long serialVersionUID = 1L;

    protected TokenInvalid(Info i) {
      super(i);
    }
  }

  /** ETCD_UNAVAILABLE: etcd unreachable. Retried. */
  public static class EtcdUnavailable extends Unavailable {
    private static final long serialVersionUID = 1L;

    protected EtcdUnavailable(Info i) {
      super(i);
    }
  }

  /** SESSION_LOST: The server's etcd session ended during the call; nothing committed. Retried. */
  public static class SessionLost extends Unavailable {
    private static final long serialVersionUID = 1L;

    protected SessionLost(Info i) {
      super(i);
    }
  }

  /** SHUTTING_DOWN: The server is stopping. Retried elsewhere. */
  public static class ShuttingDown extends Unavailable {
    private static final long serialVersionUID = 1L;

    protected ShuttingDown(Info i) {
      super(i);
    }
  }

  /** DATA_CORRUPT: A value in etcd does not decode: page the operator. */
  public static class DataCorrupt extends StockctlException {
    private static final long serialVersionUID = 1L;

    protected DataCorrupt(Info i) {
      super(i);
    }
  }

  /** DEADLINE_EXCEEDED: The deadline passed first; an order may still have been committed: retry with its ID. */
  public static class DeadlineExceeded extends StockctlException {
    private static final long serialVersionUID = 1L;

    protected DeadlineExceeded(Info i) {
      super(i);
    }
  }

  /** CANCELED: The call was cancelled. */
  public static class Canceled extends StockctlException {
    private static final long serialVersionUID = 1L;

    protected Canceled(Info i) {
      super(i);
    }
  }

  /** DELIVERY_UNSUPPORTED: No longer sent. */
  public static class DeliveryUnsupported extends Unimplemented {
    private static final long serialVersionUID = 1L;

    protected DeliveryUnsupported(Info i) {
      super(i);
    }
  }

  /** LOCK_KIND_UNSUPPORTED: A lock kind this server does not know. */
  public static class LockKindUnsupported extends Unimplemented {
    private static final long serialVersionUID = 1L;

    protected LockKindUnsupported(Info i) {
      super(i);
    }
  }

  /** INTERNAL: Anything else; the message says what. */
  public static class Internal extends StockctlException {
    private static final long serialVersionUID = 1L;

    protected Internal(Info i) {
      super(i);
    }
  }

  static {
    BY_REASON.put("INVALID_ARGUMENT", InvalidArgument::new);
    BY_REASON.put("TOKEN_IN_URL", TokenInUrl::new);
    BY_REASON.put("CURSOR_AHEAD", CursorAhead::new);
    BY_REASON.put("SKU_NOT_FOUND", SkuNotFound::new);
    BY_REASON.put("ORDER_NOT_FOUND", OrderNotFound::new);
    BY_REASON.put("HOLD_NOT_FOUND", HoldNotFound::new);
    BY_REASON.put("SKU_EXISTS", SkuExists::new);
    BY_REASON.put("ORDER_CONFLICT", OrderConflict::new);
    BY_REASON.put("DELIVERY_CONFLICT", DeliveryConflict::new);
    BY_REASON.put("ORDER_STATE_CONFLICT", OrderStateConflict::new);
    BY_REASON.put("INSUFFICIENT_STOCK", SoldOut::new);
    BY_REASON.put("PER_USER_LIMIT_EXCEEDED", PerUserLimitExceeded::new);
    BY_REASON.put("RESERVATION_EXPIRED", ReservationExpired::new);
    BY_REASON.put("ORDER_PRUNED", OrderPruned::new);
    BY_REASON.put("LOCK_LOST", LockLost::new);
    BY_REASON.put("CURSOR_COMPACTED", CursorCompacted::new);
    BY_REASON.put("LIMIT_MISMATCH", LimitMismatch::new);
    BY_REASON.put("LOCK_BUSY", LockBusy::new);
    BY_REASON.put("CONTENTION", Contention::new);
    BY_REASON.put("OVERLOADED", Overloaded::new);
    BY_REASON.put("TOO_MANY_HOLDS", TooManyHolds::new);
    BY_REASON.put("BODY_TOO_LARGE", BodyTooLarge::new);
    BY_REASON.put("TOKEN_MISSING", TokenMissing::new);
    BY_REASON.put("TOKEN_INVALID", TokenInvalid::new);
    BY_REASON.put("ETCD_UNAVAILABLE", EtcdUnavailable::new);
    BY_REASON.put("SESSION_LOST", SessionLost::new);
    BY_REASON.put("SHUTTING_DOWN", ShuttingDown::new);
    BY_REASON.put("DATA_CORRUPT", DataCorrupt::new);
    BY_REASON.put("DEADLINE_EXCEEDED", DeadlineExceeded::new);
    BY_REASON.put("CANCELED", Canceled::new);
    BY_REASON.put("DELIVERY_UNSUPPORTED", DeliveryUnsupported::new);
    BY_REASON.put("LOCK_KIND_UNSUPPORTED", LockKindUnsupported::new);
    BY_REASON.put("INTERNAL", Internal::new);
    BY_CODE.put(Status.Code.NOT_FOUND, NotFound::new);
    BY_CODE.put(Status.Code.ALREADY_EXISTS, Conflict::new);
    BY_CODE.put(Status.Code.FAILED_PRECONDITION, FailedPrecondition::new);
    BY_CODE.put(Status.Code.ABORTED, Aborted::new);
    BY_CODE.put(Status.Code.RESOURCE_EXHAUSTED, ResourceExhausted::new);
    BY_CODE.put(Status.Code.UNAUTHENTICATED, Unauthenticated::new);
    BY_CODE.put(Status.Code.PERMISSION_DENIED, PermissionDenied::new);
    BY_CODE.put(Status.Code.UNAVAILABLE, Unavailable::new);
    BY_CODE.put(Status.Code.UNIMPLEMENTED, Unimplemented::new);
    BY_CODE.put(Status.Code.OUT_OF_RANGE, OutOfRange::new);
    BY_CODE.put(Status.Code.UNKNOWN, Unknown::new);
    BY_CODE.put(Status.Code.INVALID_ARGUMENT, InvalidArgument::new);
    BY_CODE.put(Status.Code.DATA_LOSS, DataCorrupt::new);
    BY_CODE.put(Status.Code.DEADLINE_EXCEEDED, DeadlineExceeded::new);
    BY_CODE.put(Status.Code.CANCELLED, Canceled::new);
    BY_CODE.put(Status.Code.INTERNAL, Internal::new);
  }
}
