package com.github.stockctl.client;

import static com.github.stockctl.client.ClientTest.client;
import static com.github.stockctl.client.ClientTest.expect;
import static com.github.stockctl.client.ClientTest.name;
import static com.github.stockctl.client.StockctlClient.line;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertTrue;

import com.github.stockctl.v1.AllocateOrderResponse;
import com.github.stockctl.v1.AllocateResponse;
import com.github.stockctl.v1.CreateSKURequest;
import com.github.stockctl.v1.OrderState;
import com.github.stockctl.v1.RefusedLine;
import com.github.stockctl.v1.ReleaseResponse;
import com.github.stockctl.v1.ReserveOrderResponse;
import com.github.stockctl.v1.ReserveResponse;
import java.time.Duration;
import java.util.List;
import org.junit.Test;

/** allocateOrder and reserveOrder (orders of several SKUs, all or nothing) against a real serve. */
public class OrdersOfSeveralSkusTest {
  @Test
  public void allOrNothing() {
    try (StockctlClient c = client().build()) {
      String a = name("j-cart-a"), b = name("j-cart-b");
      c.createSku(a, 10, 2, 10);
      c.createSku(b, 1, 1, 1);
      AllocateOrderResponse got = c.allocateOrder(a + "-c-1", line(a, 2), line(b, 1));
      assertEquals(2, got.getLinesCount());
      assertEquals(a, got.getLines(0).getSku());
      assertEquals(2, got.getLines(0).getQty());
      assertEquals(b, got.getLines(1).getSku());
      for (AllocateResponse l : got.getLinesList()) {
        assertEquals(got.getRevision(), l.getRevision());
      }
      assertFalse(got.getReplayed());
      // a retry with the lines in another order replays the whole first outcome
      AllocateOrderResponse again = c.allocateOrder(a + "-c-1", line(b, 1), line(a, 2));
      assertTrue(again.getReplayed());
      assertEquals(got.getRevision(), again.getRevision());
      expect(StockctlException.OrderConflict.class, () -> c.allocateOrder(a + "-c-1", line(a, 3), line(b, 1)));

      // b is sold out: the refusal names line 1, and nothing of the order was taken
      StockctlException.SoldOut e = expect(StockctlException.SoldOut.class, () -> c.allocateOrder(a + "-c-2", line(a, 1), line(b, 1)));
      RefusedLine refused = e.refusedLine();
      assertEquals(1, refused.getIndex());
      assertEquals(b, refused.getSku());
      assertEquals(1, refused.getQty());
      assertEquals(b, e.sku);
      assertEquals(1, e.want);
      assertEquals(0, e.remaining);
      assertEquals(2, c.status(a).getAllocated());
      // a plain order's refusal names no line
      assertNull(expect(StockctlException.SoldOut.class, () -> c.allocate(b, b + "-x", 1)).refusedLine());

      // a reservation of every line, one deadline; confirm with one line's SKU confirms the order
      String d = name("j-cart-d");
      c.createSku(d, 5, 1, 5);
      ReserveOrderResponse r = c.reserveOrder(a + "-r-1", Duration.ofMinutes(10), line(a, 1), line(d, 2));
      assertEquals(OrderState.ORDER_STATE_RESERVED, r.getState());
      assertTrue(r.hasDeadline());
      for (ReserveResponse l : r.getLinesList()) {
        assertEquals(r.getDeadline(), l.getDeadline());
      }
      assertTrue(c.reserveOrder(a + "-r-1", Duration.ofMinutes(10), line(d, 2), line(a, 1)).getReplayed());
      c.confirm(d, a + "-r-1");
      assertEquals(0, c.status(a).getReserved());
      assertEquals(3, c.status(d).getRemaining());

      // release with one line's SKU gives the whole order back
      ReleaseResponse rel = c.release(b, a + "-c-1");
      assertEquals(1, rel.getQty());
      assertFalse(rel.getReplayed());
      assertEquals(1, c.status(a).getAllocated()); // the confirmed r-1's unit
      for (String sku : List.of(a, b, d)) {
        assertTrue(c.audit(sku).getOk());
      }
    }
  }

  @Test
  public void perUserLimitNamesTheLine() {
    try (StockctlClient c = client().build()) {
      String a = name("j-lim-a"), b = name("j-lim-b");
      c.createSku(a, 10, 1, 10);
      c.createSku(CreateSKURequest.newBuilder().setSku(b).setTotal(10).setSegments(1).setInitialFill(10).setPerUserLimit(1).build());
      StockctlException.PerUserLimitExceeded e = expect(StockctlException.PerUserLimitExceeded.class,
          () -> c.reserveOrder(a + "-1", "buyer-7", Duration.ofMinutes(5), List.of(line(a, 1), line(b, 2))));
      assertEquals(1, e.refusedLine().getIndex());
      assertEquals(b, e.refusedLine().getSku());
      assertEquals(2, e.refusedLine().getQty());
      assertEquals(1, e.limit);
      assertEquals(0, c.status(a).getReserved());
      AllocateOrderResponse ok = c.allocateOrder(a + "-2", "buyer-7", List.of(line(a, 1), line(b, 1)));
      assertEquals("buyer-7", ok.getBuyer());
    }
  }
}
