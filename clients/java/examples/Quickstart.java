// A sale through stockctl serve with the Java client:
//   java -cp ... Quickstart 127.0.0.1:7070 TOKEN
import com.github.stockctl.client.Lock;
import com.github.stockctl.client.OrderFeedConsumer;
import com.github.stockctl.client.StockctlClient;
import com.github.stockctl.client.StockctlException;
import com.github.stockctl.v1.AllocateRequest;
import com.github.stockctl.v1.AllocateResponse;
import com.github.stockctl.v1.OrderEvent;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.time.Duration;
import java.util.UUID;

public class Quickstart {
  public static void main(String[] args) throws Exception {
    String sku = "mug-" + UUID.randomUUID().toString().substring(0, 8); // a fresh SKU each run
    // .target(a).target(b): retries fail over
    try (StockctlClient client = StockctlClient.builder().target(args[0]).token(args[1]).build()) {
      client.createSku(sku, 10, 2, 10);

      // An order; UNAVAILABLE, CANCELLED and DEADLINE_EXCEEDED are retried with the
      // same order ID, so a lost reply cannot take the stock twice.
      AllocateRequest order = AllocateRequest.newBuilder()
          .setSku(sku).setOrder(sku + "-1").setQty(2).setRouteKey("user-42").build();
      AllocateResponse a = client.allocate(order);
      System.out.println("allocated " + a.getQty() + " from " + a.getPartsList());
      if (!client.allocate(order).getReplayed()) {
        throw new AssertionError("a retry must be replayed");
      }

      // A refusal's reason is its exception class, its detail its fields.
      try {
        client.allocate(sku, sku + "-2", 50);
      } catch (StockctlException.SoldOut e) {
        System.out.println("sold out: want " + e.want + " have " + e.remaining + " at revision " + e.revision);
      }

      // A lock: kept alive in the background; pass the fencing token to the store
      // it protects. close() throws LockLost if it was lost.
      try (Lock held = client.lock("nightly-report", Duration.ofSeconds(30))) {
        System.out.println("holding nightly-report with fencing token " + held.token());
        held.check(); // throws LockLost at once if the hold was lost
      } catch (StockctlException.LockLost e) {
        System.out.println("lost the lock: " + e.lostReason);
      }

      // The order feed into SQLite: each batch's rows and its cursor commit in one
      // transaction, so a consumer killed anywhere resumes exactly.
      try (Connection db = DriverManager.getConnection("jdbc:sqlite::memory:")) {
        db.createStatement().execute("CREATE TABLE orders (order_id TEXT PRIMARY KEY, state TEXT, qty INTEGER, revision INTEGER)");
        OrderFeedConsumer feed = new OrderFeedConsumer(client, db, sku, (conn, events) -> {
          for (OrderEvent e : events) {
            try (PreparedStatement p = conn.prepareStatement("INSERT INTO orders VALUES (?, ?, ?, ?) ON CONFLICT (order_id) "
                + "DO UPDATE SET state = excluded.state, revision = excluded.revision WHERE excluded.revision > orders.revision")) {
              p.setString(1, e.getOrder());
              p.setString(2, OrderFeedConsumer.kind(e));
              p.setLong(3, e.getQty());
              p.setLong(4, e.getRevision());
              p.executeUpdate();
            }
          }
        }).snapshotFirst();
        long cursor = feed.run(a.getRevision()); // a service runs it with null: for ever
        System.out.println("feed: cursor " + cursor);
      }
    }
    System.out.println("quickstart: ok");
  }
}
