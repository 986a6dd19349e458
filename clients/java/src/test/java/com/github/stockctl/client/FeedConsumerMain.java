package com.github.stockctl.client;

import com.github.stockctl.v1.OrderEvent;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.Statement;

/**
 * A consumer of one SKU's order feed into SQLite, run in its own JVM by ClientTest: TARGET TOKEN DB
 * SKU SINCE UNTIL CRASH_AFTER. With CRASH_AFTER > 0 it SIGKILLs itself after applying that many
 * events, in the middle of a batch's open transaction.
 */
public final class FeedConsumerMain {
  public static void main(String[] args) throws Exception {
    String target = args[0], token = args[1], db = args[2], sku = args[3];
    long since = Long.parseLong(args[4]), until = Long.parseLong(args[5]);
    int crashAfter = Integer.parseInt(args[6]);
    int[] applied = {0};
    try (Connection conn = DriverManager.getConnection("jdbc:sqlite:" + db);
        StockctlClient client = StockctlClient.builder().target(target).token(token).build()) {
      try (Statement s = conn.createStatement()) {
        s.execute("CREATE TABLE IF NOT EXISTS orders (order_id TEXT PRIMARY KEY, state TEXT NOT NULL, qty INTEGER NOT NULL, revision INTEGER NOT NULL)");
        // every event once: a second delivery of an event breaks this primary key
        s.execute("CREATE TABLE IF NOT EXISTS events (revision INTEGER NOT NULL, order_id TEXT NOT NULL, kind TEXT NOT NULL, PRIMARY KEY (revision, order_id))");
      }
      OrderFeedConsumer consumer = new OrderFeedConsumer(client, conn, sku, (c, events) -> {
        for (OrderEvent e : events) {
          try (PreparedStatement p = c.prepareStatement("INSERT INTO orders (order_id, state, qty, revision) VALUES (?, ?, ?, ?) "
              + "ON CONFLICT (order_id) DO UPDATE SET state = excluded.state, revision = excluded.revision WHERE excluded.revision > orders.revision")) {
            p.setString(1, e.getOrder());
            p.setString(2, OrderFeedConsumer.kind(e));
            p.setLong(3, e.getQty());
            p.setLong(4, e.getRevision());
            p.executeUpdate();
          }
          try (PreparedStatement p = c.prepareStatement("INSERT INTO events (revision, order_id, kind) VALUES (?, ?, ?)")) {
            p.setLong(1, e.getRevision());
            p.setString(2, e.getOrder());
            p.setString(3, OrderFeedConsumer.kind(e));
            p.executeUpdate();
          }
          if (crashAfter > 0 && ++applied[0] >= crashAfter) {
            try {
              new ProcessBuilder("kill", "-KILL", Long.toString(ProcessHandle.current().pid())).start().waitFor();
              Thread.sleep(Long.MAX_VALUE); // the kill lands before this ends
            } catch (java.io.IOException | InterruptedException x) {
              throw new IllegalStateException(x);
            }
          }
        }
      }).since(since);
      System.out.println("consumer: cursor " + consumer.run(until));
    }
  }
}
