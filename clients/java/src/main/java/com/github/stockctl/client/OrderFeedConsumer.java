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
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.TreeMap;

/**
 * Applies the order feed to a database exactly once: for each batch it calls {@code
 * apply(connection, events)}, stores the batch's position in the table {@code stockctl_feed_cursor}
 * (row {@code scope}) on the same JDBC connection, and commits. The rows and the feed's position
 * commit together, so a consumer killed at any point resumes exactly after the last batch it
 * committed. Write apply as an upsert that keeps the newest revision (docs/feed.md).
 *
 * <p>The position is a revision (column {@code revision}), or, for every SKU's feed on a serve over
 * several etcd clusters, the merged cursor the server sends with each batch (column {@code
 * merged_cursor}: a revision per cluster, opaque; {@code revision} is then 0). The consumer stores
 * whichever the server sends and resumes from it ({@code merged_since}): {@link #cursor()} and
 * {@link #run(Long)} for a revision, {@link #mergedCursor()} and {@link #runMerged(Map)} for a
 * merged feed. A table made by an older version gains the column (ALTER TABLE ... ADD COLUMN).
 *
 * <p>A broken stream is opened again from the stored position, on the client's next target. A
 * cursor older than etcd's compacted history throws CursorCompacted (on a merged feed its {@code
 * cluster} names the cluster), or with {@link #snapshotOnCompacted()} starts again from a snapshot
 * (not on a merged feed, which has no snapshot: there it throws). A merged cursor naming a cluster
 * the server does not have, or skipping a removed cluster's last events, throws MergedCursorRefused
 * ({@code cluster} names it).
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
  private String sinceMerged = "";
  private boolean snapshotFirst;
  private boolean snapshotOnCompacted;
  private Duration streamDeadline = Duration.ofMinutes(1);
  private volatile boolean stopped;
  private volatile StockctlClient.ServerStream<WatchOrdersResponse> stream;
  private volatile int reopened;

  /** A consumer of sku's feed (empty: every SKU), its cursor stored as scope sku (or "*"). */
  public OrderFeedConsumer(StockctlClient client, Connection conn, String sku, Apply apply) throws SQLException {
    this.client = client;
    this.conn = conn;
    this.apply = apply;
    this.sku = sku;
    this.scope = sku.isEmpty() ? "*" : sku;
    conn.setAutoCommit(false);
    try (Statement s = conn.createStatement()) {
      s.execute("CREATE TABLE IF NOT EXISTS stockctl_feed_cursor (scope VARCHAR(255) PRIMARY KEY, revision BIGINT NOT NULL, "
          + "merged_cursor VARCHAR(1024) NOT NULL DEFAULT '')");
    }
    conn.commit();
    try (Statement s = conn.createStatement()) { // a table of an older version has no merged_cursor
      s.executeQuery("SELECT merged_cursor FROM stockctl_feed_cursor WHERE 1 = 0").close();
      conn.commit();
    } catch (SQLException e) {
      conn.rollback();
      try (Statement s = conn.createStatement()) {
        s.execute("ALTER TABLE stockctl_feed_cursor ADD COLUMN merged_cursor VARCHAR(1024) NOT NULL DEFAULT ''");
      }
      conn.commit();
    }
  }

  /** Before the first batch is stored, start after this revision (0: etcd's history's start). */
  public OrderFeedConsumer since(long revision) {
    this.since = revision;
    return this;
  }

  /** Before the first batch is stored, start a merged feed after this merged cursor ("": every cluster's start). */
  public OrderFeedConsumer since(String mergedCursor) {
    this.sinceMerged = mergedCursor;
    return this;
  }

  /** Before the first batch is stored, start from a snapshot (every order in its current state; a feed of one cluster). */
  public OrderFeedConsumer snapshotFirst() {
    this.snapshotFirst = true;
    return this;
  }

  /** On CursorCompacted, start again from a snapshot instead of throwing (not on a merged feed). */
  public OrderFeedConsumer snapshotOnCompacted() {
    this.snapshotOnCompacted = true;
    return this;
  }

  /** Each stream's deadline (1 minute): at its end the stream is opened again from the stored position. */
  public OrderFeedConsumer streamDeadline(Duration d) {
    this.streamDeadline = d;
    return this;
  }

  /** How many times the stream was opened again (after a deadline, a break, a failover). */
  public int reopened() {
    return reopened;
  }

  /** The stored position: {revision, merged cursor}, or null before the first batch. */
  private Object[] stored() throws SQLException {
    try (PreparedStatement p = conn.prepareStatement("SELECT revision, merged_cursor FROM stockctl_feed_cursor WHERE scope = ?")) {
      p.setString(1, scope);
      try (ResultSet r = p.executeQuery()) {
        Object[] c = r.next() ? new Object[] {r.getLong(1), r.getString(2) == null ? "" : r.getString(2)} : null;
        conn.commit();
        return c;
      }
    }
  }

  /** The stored revision cursor, or null before the first batch or when the stored position is a merged cursor. */
  public Long cursor() throws SQLException {
    Object[] c = stored();
    return c == null || !((String) c[1]).isEmpty() ? null : (Long) c[0];
  }

  /** The stored merged cursor (a feed of every SKU over several clusters), or null when none is stored. */
  public String mergedCursor() throws SQLException {
    Object[] c = stored();
    return c == null || ((String) c[1]).isEmpty() ? null : (String) c[1];
  }

  /**
   * A merged cursor's revision per cluster ("a=1204,b=877"). Store and pass a merged cursor as the
   * string it is; this is for comparing positions ({@link #runMerged(Map)}): the format is the
   * server's.
   */
  public static Map<String, Long> parseMergedCursor(String cursor) {
    Map<String, Long> out = new TreeMap<>();
    if (cursor == null || cursor.isEmpty()) {
      return out;
    }
    for (String part : cursor.split(",")) {
      int eq = part.indexOf('=');
      if (eq <= 0) {
        throw new IllegalArgumentException("not a merged cursor: " + cursor);
      }
      out.put(part.substring(0, eq), Long.parseLong(part.substring(eq + 1)));
    }
    return out;
  }

  /** Whether the merged cursor is at or past until in every cluster until names. */
  public static boolean reached(String mergedCursor, Map<String, Long> until) {
    Map<String, Long> have = parseMergedCursor(mergedCursor);
    for (Map.Entry<String, Long> e : until.entrySet()) {
      if (have.getOrDefault(e.getKey(), 0L) < e.getValue()) {
        return false;
      }
    }
    return true;
  }

  private void commit(List<OrderEvent> events, long cursor, String merged) throws SQLException {
    try {
      apply.apply(conn, events);
      try (PreparedStatement u = conn.prepareStatement("UPDATE stockctl_feed_cursor SET revision = ?, merged_cursor = ? WHERE scope = ?")) {
        u.setLong(1, merged.isEmpty() ? cursor : 0);
        u.setString(2, merged);
        u.setString(3, scope);
        if (u.executeUpdate() == 0) {
          try (PreparedStatement i = conn.prepareStatement("INSERT INTO stockctl_feed_cursor (scope, revision, merged_cursor) VALUES (?, ?, ?)")) {
            i.setString(1, scope);
            i.setLong(2, merged.isEmpty() ? cursor : 0);
            i.setString(3, merged);
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

  /**
   * Applies batches until stop(), or until the stored revision cursor reaches until (null: no end);
   * returns it (0 when the stored position is a merged cursor: see {@link #runMerged(Map)}).
   */
  public long run(Long until) throws SQLException, InterruptedException {
    if (until != null && (mergedCursor() != null || (cursor() == null && !sinceMerged.isEmpty()))) {
      throw new IllegalStateException("until is a revision, but the feed's position is a merged cursor: use runMerged");
    }
    loop(until == null ? null : (rev, merged) -> merged.isEmpty() && rev >= until);
    Long c = cursor();
    return c == null ? 0 : c;
  }

  /**
   * Applies the batches of a merged feed (every SKU on a serve over several clusters) until stop(),
   * or until the stored merged cursor is at or past until's revision in every cluster it names
   * (null: no end); returns the stored merged cursor ("" before the first batch).
   */
  public String runMerged(Map<String, Long> until) throws SQLException, InterruptedException {
    Map<String, Long> u = until == null ? null : new LinkedHashMap<>(until);
    loop(u == null ? null : (rev, merged) -> (!merged.isEmpty() || rev == 0) && reached(merged, u));
    String m = mergedCursor();
    return m == null ? "" : m;
  }

  private interface Done {
    boolean test(long revision, String merged);
  }

  private void loop(Done done) throws SQLException, InterruptedException {
    int attempt = 0;
    boolean snapshot = false;
    while (!stopped) {
      Object[] cur = stored();
      long from = cur == null ? since : (Long) cur[0];
      String merged = cur == null ? sinceMerged : (String) cur[1];
      if (done != null && done.test(from, merged)) {
        return;
      }
      snapshot = snapshot || (cur == null && snapshotFirst);
      WatchOrdersRequest.Builder req = WatchOrdersRequest.newBuilder().setSku(sku).setSnapshot(snapshot);
      if (!snapshot) {
        if (merged.isEmpty()) {
          req.setSince(from);
        } else {
          req.setMergedSince(merged);
        }
      }
      List<OrderEvent> pending = new ArrayList<>();
      try (StockctlClient.ServerStream<WatchOrdersResponse> s = client.watchOrders(req.build(), streamDeadline)) {
        stream = s;
        while (s.hasNext()) {
          WatchOrdersResponse b = s.next();
          attempt = 0;
          if (b.getSnapshot() && b.getCursor() == 0) {
            pending.addAll(b.getEventsList()); // a snapshot page: its cursor comes on the last page
            continue;
          }
          pending.addAll(b.getEventsList());
          commit(pending, b.getCursor(), b.getMergedCursor());
          pending = new ArrayList<>();
          snapshot = false;
          if (done != null && done.test(b.getMergedCursor().isEmpty() ? b.getCursor() : 0, b.getMergedCursor())) {
            return;
          }
          if (stopped) {
            break;
          }
        }
      } catch (StockctlException.CursorCompacted e) {
        if (!snapshotOnCompacted || e.cluster != null || !merged.isEmpty()) {
          throw e; // a merged feed has no snapshot to start again from
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
      reopened++;
    }
  }

  /** The event's kind in lower case ("allocated", "confirmed"...), also the order's state after it. */
  public static String kind(OrderEvent e) {
    return e.getEvent().name().replace("ORDER_EVENT_KIND_", "").toLowerCase(Locale.ROOT);
  }
}
