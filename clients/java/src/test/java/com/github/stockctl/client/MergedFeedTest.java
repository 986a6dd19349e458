package com.github.stockctl.client;

import static com.github.stockctl.client.ClientTest.BOUND;
import static com.github.stockctl.client.ClientTest.TOKEN;
import static com.github.stockctl.client.ClientTest.env;
import static com.github.stockctl.client.ClientTest.expect;
import static com.github.stockctl.client.ClientTest.name;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import com.github.stockctl.v1.OrderEvent;
import com.github.stockctl.v1.WatchOrdersRequest;
import com.github.stockctl.v1.WatchOrdersResponse;
import java.io.File;
import java.nio.file.Files;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.Test;

/**
 * OrderFeedConsumer against serves over two etcd clusters, "a" and "b" (started by the Go test
 * clients/TestJavaClient): every SKU's feed is the clusters' feeds merged, its position the merged
 * cursor, stored in the caller's transaction and resumed from.
 */
public class MergedFeedTest {
  static final String SKU_A = System.getenv("STOCKCTL_MERGED_SKU_A");
  static final String SKU_B = System.getenv("STOCKCTL_MERGED_SKU_B");
  static final long COMPACTED_A = Long.parseLong(System.getenv().getOrDefault("STOCKCTL_MERGED_COMPACTED_A", "0"));
  static final long SPARE_PID = Long.parseLong(System.getenv().getOrDefault("STOCKCTL_MERGED_SPARE_PID", "0"));

  static StockctlClient.Builder merged(String... targets) {
    StockctlClient.Builder b = StockctlClient.builder().token(TOKEN);
    if (targets.length == 0) {
      b.target(env("STOCKCTL_MERGED_TARGET"));
    }
    for (String t : targets) {
      b.target(t);
    }
    return b;
  }

  /** Orders of every kind of transition on the SKU of each cluster; the last revision of each cluster. */
  static Map<String, Long> place(StockctlClient c, String tag, int n) {
    Map<String, Long> last = new TreeMap<>();
    for (String[] p : new String[][] {{"a", SKU_A}, {"b", SKU_B}}) {
      for (int i = 0; i < n; i++) {
        String o = tag + "-" + i;
        long r;
        if (i % 3 == 0) {
          c.reserve(p[1], o, 1, Duration.ofMinutes(10));
          r = i % 2 == 0 ? c.confirm(p[1], o).getRevision() : c.cancel(p[1], o).getRevision();
        } else {
          r = c.allocate(p[1], o, 1).getRevision();
          if (i % 4 == 1) {
            r = c.release(p[1], o).getRevision();
          }
        }
        last.put(p[0], r);
      }
    }
    return last;
  }

  /** The merged cursor a consumer starts from: cluster a after its compaction, b from its start. */
  static String start() {
    return "a=" + COMPACTED_A;
  }

  /** A SQLite table of events, each (sku, order, kind) once: a repeat breaks its primary key. */
  static final class Table {
    final String url;
    final Connection conn;
    final AtomicInteger failAfter = new AtomicInteger();

    Table() throws Exception {
      File dir = Files.createTempDirectory("merged-feed").toFile();
      url = "jdbc:sqlite:" + new File(dir, "feed.db").getPath();
      conn = DriverManager.getConnection(url);
      try (Statement s = conn.createStatement()) {
        s.execute("CREATE TABLE events (sku TEXT NOT NULL, order_id TEXT NOT NULL, kind TEXT NOT NULL, revision INTEGER NOT NULL, "
            + "PRIMARY KEY (sku, order_id, kind))");
      }
    }

    void apply(Connection c, List<OrderEvent> events) throws SQLException {
      for (OrderEvent e : events) {
        try (PreparedStatement p = c.prepareStatement("INSERT INTO events VALUES (?, ?, ?, ?)")) {
          p.setString(1, e.getSku());
          p.setString(2, e.getOrder());
          p.setString(3, OrderFeedConsumer.kind(e));
          p.setLong(4, e.getRevision());
          p.executeUpdate();
        }
        if (failAfter.get() > 0 && failAfter.decrementAndGet() == 0) {
          throw new IllegalStateException("the consumer dies in the middle of a batch");
        }
      }
    }

    List<String> rows() throws SQLException {
      List<String> out = new ArrayList<>();
      try (Connection c = DriverManager.getConnection(url); Statement s = c.createStatement();
          ResultSet r = s.executeQuery("SELECT sku, order_id, kind, revision FROM events")) {
        while (r.next()) {
          out.add(r.getString(1) + " " + r.getString(2) + " " + r.getString(3) + " " + r.getLong(4));
        }
      }
      Collections.sort(out);
      return out;
    }

    /** The stored merged cursor, read on a connection of its own (null: none). */
    String stored() throws SQLException {
      try (Connection c = DriverManager.getConnection(url); Statement s = c.createStatement();
          ResultSet r = s.executeQuery("SELECT merged_cursor FROM stockctl_feed_cursor WHERE scope = '*'")) {
        return r.next() ? r.getString(1) : null;
      }
    }
  }

  /** Every event of the merged feed after since up to until (per cluster), read afresh. */
  static List<String> feedFrom(StockctlClient c, String since, Map<String, Long> until) {
    List<String> out = new ArrayList<>();
    try (StockctlClient.ServerStream<WatchOrdersResponse> s = c.watchOrders(WatchOrdersRequest.newBuilder().setMergedSince(since).build(), BOUND)) {
      while (s.hasNext()) {
        WatchOrdersResponse b = s.next();
        for (OrderEvent e : b.getEventsList()) {
          out.add(e.getSku() + " " + e.getOrder() + " " + OrderFeedConsumer.kind(e) + " " + e.getRevision());
        }
        if (OrderFeedConsumer.reached(b.getMergedCursor(), until)) {
          break;
        }
      }
    }
    Collections.sort(out);
    return out;
  }

  @Test
  public void resumesAcrossACrashAndAKilledServeExactly() throws Exception {
    String spare = env("STOCKCTL_MERGED_SPARE_TARGET");
    assertTrue("no spare serve over the clusters to kill", SPARE_PID > 0);
    try (StockctlClient c = merged().build(); StockctlClient fc = merged(spare, env("STOCKCTL_MERGED_TARGET")).build()) {
      Table t = new Table();
      OrderFeedConsumer consumer = new OrderFeedConsumer(fc, t.conn, "", t::apply).since(start()).streamDeadline(BOUND);
      Map<String, Long> until = place(c, name("j1"), 12);
      // a consumer that dies in the middle of a batch rolls it back with its transaction ...
      t.failAfter.set(3);
      try {
        consumer.runMerged(until);
        fail("apply's error must end run");
      } catch (IllegalStateException want) {
        // the crash
      }
      assertTrue(t.rows().size() < 3);
      // ... and the next run applies it again, whole, from the stored merged cursor
      String pos = consumer.runMerged(until);
      assertEquals(pos, consumer.mergedCursor());
      assertEquals(pos, t.stored());
      assertNull("a merged position is no revision", consumer.cursor());
      Map<String, Long> got = OrderFeedConsumer.parseMergedCursor(pos);
      assertEquals(Set.of("a", "b"), got.keySet());
      assertTrue(got + " " + until, OrderFeedConsumer.reached(pos, until));
      try {
        consumer.run(1L);
        fail("run(revision) of a merged feed");
      } catch (IllegalStateException want) {
        // use runMerged
      }

      // a consumer following the spare serve when it is killed goes on on the other, from its cursor
      AtomicReference<Object> result = new AtomicReference<>();
      Thread th = new Thread(() -> {
        try {
          result.set(consumer.runMerged(null));
        } catch (Throwable e) {
          result.set(e);
        }
      });
      th.start();
      Thread.sleep(500); // its stream is open on the spare
      ProcessHandle.of(SPARE_PID).orElseThrow().destroyForcibly(); // SIGKILL
      until = place(c, name("j2"), 12);
      Instant bound = Instant.now().plus(BOUND);
      while (Instant.now().isBefore(bound)) {
        String s = t.stored();
        if (s != null && OrderFeedConsumer.reached(s, until)) {
          break;
        }
        Thread.sleep(50);
      }
      consumer.stop();
      th.join(BOUND.toMillis());
      assertFalse("the consumer did not stop", th.isAlive());
      assertFalse(String.valueOf(result.get()), result.get() instanceof Throwable);
      assertTrue(consumer.reopened() >= 1);
      assertEquals(env("STOCKCTL_MERGED_TARGET"), fc.currentTarget());

      // the table holds the feed from the start cursor, each event once: nothing lost, nothing repeated
      List<String> want = feedFrom(c, start(), OrderFeedConsumer.parseMergedCursor(t.stored()));
      assertEquals(want, t.rows());
      assertTrue(want.size() > 40);
      Set<String> skus = new TreeSet<>();
      for (String r : want) {
        skus.add(r.split(" ")[0]);
      }
      assertEquals(new TreeSet<>(List.of(SKU_A, SKU_B)), skus);
    }
  }

  @Test
  public void refusedCursorsAreTyped() throws Exception {
    try (StockctlClient c = merged().build()) {
      // a cursor of cluster a older than its compacted history
      StockctlException.CursorCompacted e = expect(StockctlException.CursorCompacted.class, () -> {
        try (StockctlClient.ServerStream<WatchOrdersResponse> s = c.watchOrders(WatchOrdersRequest.newBuilder().setMergedSince("a=1").build(), BOUND)) {
          while (s.hasNext()) {
            s.next();
          }
        }
      });
      assertEquals("a", e.cluster);
      assertEquals(1, e.cursor);
      assertEquals(COMPACTED_A, e.compactRevision);
      // a consumer resuming from it throws it too: a merged feed has no snapshot to start again from
      Table t = new Table();
      OrderFeedConsumer consumer = new OrderFeedConsumer(c, t.conn, "", t::apply).since("a=1,b=0").snapshotOnCompacted().streamDeadline(BOUND);
      try {
        consumer.runMerged(null);
        fail("want CursorCompacted");
      } catch (StockctlException.CursorCompacted got) {
        assertEquals("a", got.cluster);
      }
      // cluster b's batches may have come (and been stored) first: a's position stays where it was
      String stored = t.stored();
      assertTrue(stored, stored == null || OrderFeedConsumer.parseMergedCursor(stored).get("a") == 1);

      // a cursor naming a cluster the server does not have (removed from its list)
      Table t2 = new Table();
      OrderFeedConsumer gone = new OrderFeedConsumer(c, t2.conn, "", t2::apply).since(start() + ",gone=7").streamDeadline(BOUND);
      try {
        gone.runMerged(null);
        fail("want MergedCursorRefused");
      } catch (StockctlException.MergedCursorRefused got) {
        assertEquals("gone", got.cluster);
        assertEquals("merged_since", got.field);
        assertEquals("INVALID_ARGUMENT", got.reason);
        assertTrue(got instanceof StockctlException.InvalidArgument);
      }
      // a malformed cursor stays a plain InvalidArgument
      StockctlException.InvalidArgument bad = expect(StockctlException.InvalidArgument.class, () -> {
        try (StockctlClient.ServerStream<WatchOrdersResponse> s = c.watchOrders(WatchOrdersRequest.newBuilder().setMergedSince("nonsense").build(), BOUND)) {
          s.hasNext();
        }
      });
      assertFalse(bad instanceof StockctlException.MergedCursorRefused);
    }
  }

  @Test
  public void oneSkusFeedKeepsARevisionCursor() throws Exception {
    try (StockctlClient c = merged().build()) {
      Map<String, Long> until = place(c, name("j3"), 3);
      Table t = new Table();
      OrderFeedConsumer consumer = new OrderFeedConsumer(c, t.conn, SKU_B, t::apply).streamDeadline(BOUND);
      long pos = consumer.run(until.get("b"));
      assertTrue(pos >= until.get("b"));
      assertEquals(Long.valueOf(pos), consumer.cursor());
      assertNull(consumer.mergedCursor());
      for (String r : t.rows()) {
        assertTrue(r, r.startsWith(SKU_B + " "));
      }
    }
  }

  @Test
  public void listSkusNamesEachSkusCluster() {
    try (StockctlClient c = merged().build(); StockctlClient one = ClientTest.client().build()) {
      Map<String, String> where = c.listSkuClusters(1);
      assertEquals("a", where.get(SKU_A));
      assertEquals("b", where.get(SKU_B));
      assertEquals(new ArrayList<>(where.keySet()), c.listSkus(0));
      assertEquals(Set.of(""), new TreeSet<>(one.listSkuClusters(0).values()));
    }
  }

  @Test
  public void oldCursorTableGainsTheColumn() throws Exception {
    try (StockctlClient c = merged().build()) {
      Table t = new Table();
      try (Statement s = t.conn.createStatement()) {
        s.execute("CREATE TABLE stockctl_feed_cursor (scope VARCHAR(255) PRIMARY KEY, revision BIGINT NOT NULL)");
        s.execute("INSERT INTO stockctl_feed_cursor VALUES ('" + SKU_A + "', 1099511627776)");
      }
      OrderFeedConsumer consumer = new OrderFeedConsumer(c, t.conn, SKU_A, t::apply);
      assertNotNull(consumer.cursor());
      assertEquals(1099511627776L, (long) consumer.cursor());
      assertNull(consumer.mergedCursor());
    }
  }
}
