package com.github.stockctl.client;

import com.github.stockctl.v1.OrderEvent;
import com.github.stockctl.v1.WatchOrdersRequest;
import com.github.stockctl.v1.WatchOrdersResponse;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;

/**
 * Applies the order feed to a database exactly once: for each batch it calls {@code
 * apply(connection, events)}, stores the batch's cursor in the table {@code stockctl_feed_cursor}
 * (row {@code scope}) on the same JDBC connection, and commits. The rows and the feed's position
 * commit together, so a consumer killed at any point resumes exactly after the last batch it
 * committed. Write apply as an upsert that keeps the newest revision (docs/feed.md).
 *
 * <p>A broken stream is opened again from the stored cursor, on the client's next target. A cursor
 * older than etcd's compacted history throws CursorCompacted, or with {@link
 * #snapshotOnCompacted()} starts again from a snapshot.
 */
public final class OrderFeedConsumer {
  /** What a consumer does with a batch, inside its transaction. */
  @FunctionalInterface
  public interface Apply {
    void apply(Connection conn, List<OrderEvent> events) throws SQLException;
  }

  private final StockctlClient client;
  private final Connection conn;
  private final Apply apply;
  private final String sku;
  private final String scope;
  private long since;
  private boolean snapshotFirst;
  private boolean snapshotOnCompacted;
  private Duration streamDeadline = Duration.ofMinutes(1);
  private volatile boolean stopped;
  private volatile StockctlClient.ServerStream<WatchOrdersResponse> stream;

  /** A consumer of sku's feed (empty: every SKU), its cursor stored as scope sku (or "*"). */
  public OrderFeedConsumer(StockctlClient client, Connection conn, String sku, Apply apply) throws SQLException {
    this.client = client;
    this.conn = conn;
    this.apply = apply;
    this.sku = sku;
    this.scope = sku.isEmpty() ? "*" : sku;
    conn.setAutoCommit(false);
    try (Statement s = conn.createStatement()) {
      s.execute("CREATE TABLE IF NOT EXISTS stockctl_feed_cursor (scope VARCHAR(255) PRIMARY KEY, revision BIGINT NOT NULL)");
    }
    conn.commit();
  }

  /** Before the first batch is stored, start after this revision (0: etcd's history's start). */
  public OrderFeedConsumer since(long revision) {
    this.since = revision;
    return this;
  }

  /** Before the first batch is stored, start from a snapshot (every order in its current state). */
  public OrderFeedConsumer snapshotFirst() {
    this.snapshotFirst = true;
    return this;
  }

  /** On CursorCompacted, start again from a snapshot instead of throwing. */
  public OrderFeedConsumer snapshotOnCompacted() {
    this.snapshotOnCompacted = true;
    return this;
  }

  /** The stored cursor, or null before the first batch. */
  public Long cursor() throws SQLException {
    try (PreparedStatement p = conn.prepareStatement("SELECT revision FROM stockctl_feed_cursor WHERE scope = ?")) {
      p.setString(1, scope);
      try (ResultSet r = p.executeQuery()) {
        Long c = r.next() ? r.getLong(1) : null;
        conn.commit();
        return c;
      }
    }
  }

  private void commit(List<OrderEvent> events, long cursor) throws SQLException {
    try {
      apply.apply(conn, events);
      try (PreparedStatement u = conn.prepareStatement("UPDATE stockctl_feed_cursor SET revision = ? WHERE scope = ?")) {
        u.setLong(1, cursor);
        u.setString(2, scope);
        if (u.executeUpdate() == 0) {
          try (PreparedStatement i = conn.prepareStatement("INSERT INTO stockctl_feed_cursor (scope, revision) VALUES (?, ?)")) {
            i.setString(1, scope);
            i.setLong(2, cursor);
            i.executeUpdate();
          }
        }
      }
      conn.commit();
    } catch (SQLException | RuntimeException e) {
      conn.rollback();
      throw e;
    }
  }

  /** Makes run() return after the batch it is applying (from another thread). */
  public void stop() {
    stopped = true;
    StockctlClient.ServerStream<WatchOrdersResponse> s = stream;
    if (s != null) {
      s.close();
    }
  }

  /** Applies batches until stop(), or until the stored cursor reaches until (null: no end); returns it. */
  public long run(Long until) throws SQLException, InterruptedException {
    int attempt = 0;
    boolean snapshot = false;
    while (!stopped) {
      Long cur = cursor();
      long from = cur == null ? since : cur;
      if (until != null && from >= until) {
        return from;
      }
      snapshot = snapshot || (cur == null && snapshotFirst);
      WatchOrdersRequest req = WatchOrdersRequest.newBuilder().setSku(sku).setSince(snapshot ? 0 : from).setSnapshot(snapshot).build();
      List<OrderEvent> pending = new ArrayList<>();
      try (StockctlClient.ServerStream<WatchOrdersResponse> s = client.watchOrders(req, streamDeadline)) {
        stream = s;
        while (s.hasNext()) {
          WatchOrdersResponse b = s.next();
          attempt = 0;
          if (b.getSnapshot() && b.getCursor() == 0) {
            pending.addAll(b.getEventsList()); // a snapshot page: its cursor comes on the last page
            continue;
          }
          pending.addAll(b.getEventsList());
          commit(pending, b.getCursor());
          pending = new ArrayList<>();
          snapshot = false;
          if (until != null && b.getCursor() >= until) {
            return b.getCursor();
          }
          if (stopped) {
            break;
          }
        }
      } catch (StockctlException.CursorCompacted e) {
        if (!snapshotOnCompacted) {
          throw e;
        }
        snapshot = true;
        continue;
      } catch (StockctlException e) {
        if (stopped) {
          break;
        }
        if (!e.retryable()) {
          throw e;
        }
        client.failover(client.target());
        Thread.sleep(client.delayMillis(attempt++, e));
      } finally {
        stream = null;
      }
    }
    Long c = cursor();
    return c == null ? 0 : c;
  }

  /** The event's kind in lower case ("allocated", "confirmed"...), also the order's state after it. */
  public static String kind(OrderEvent e) {
    return e.getEvent().name().replace("ORDER_EVENT_KIND_", "").toLowerCase(Locale.ROOT);
  }
}
