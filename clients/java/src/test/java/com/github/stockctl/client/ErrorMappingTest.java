package com.github.stockctl.client;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertSame;
import static org.junit.Assert.assertTrue;

import com.github.stockctl.client.rpc.ErrorInfo;
import com.github.stockctl.client.rpc.Status;
import com.github.stockctl.v1.ErrorReason;
import com.github.stockctl.v1.InsufficientStock;
import com.github.stockctl.v1.LostReason;
import com.google.protobuf.Any;
import com.google.protobuf.Message;
import java.util.HashSet;
import java.util.Set;
import org.junit.Test;

/** Every ErrorReason maps to its own exception class, with its detail's fields (no server needed). */
public class ErrorMappingTest {
  static byte[] status(String reason, Message... details) {
    Status.Builder s = Status.newBuilder().setMessage("m " + reason)
        .addDetails(Any.newBuilder().setTypeUrl("type.googleapis.com/google.rpc.ErrorInfo")
            .setValue(ErrorInfo.newBuilder().setReason(reason).setDomain("stockctl").build().toByteString()));
    for (Message d : details) {
      s.addDetails(Any.pack(d, "type.googleapis.com"));
    }
    return s.build().toByteArray();
  }

  @Test
  public void everyReasonHasItsClass() {
    Set<Class<?>> seen = new HashSet<>();
    int n = 0;
    for (ErrorReason r : ErrorReason.values()) {
      if (r == ErrorReason.ERROR_REASON_UNSPECIFIED || r == ErrorReason.UNRECOGNIZED) {
        continue;
      }
      n++;
      String reason = r.name().substring("ERROR_REASON_".length());
      assertNotNull("no class for " + reason, StockctlException.BY_REASON.get(reason));
      StockctlException e = StockctlException.from(io.grpc.Status.Code.UNKNOWN, "", status(reason), null);
      assertTrue(reason + " mapped to the base class", e.getClass() != StockctlException.class);
      assertTrue("two reasons share " + e.getClass(), seen.add(e.getClass()));
      assertEquals(reason, e.reason);
      assertEquals("m " + reason, e.getMessage());
    }
    assertEquals(32, n);
  }

  @Test
  public void typedDetails() {
    StockctlException e = StockctlException.from(io.grpc.Status.Code.FAILED_PRECONDITION, "",
        status("INSUFFICIENT_STOCK", InsufficientStock.newBuilder().setSku("s").setWant(5).setRemaining(1).setRevision(19).build()), null);
    StockctlException.SoldOut s = (StockctlException.SoldOut) e;
    assertEquals("s", s.sku);
    assertEquals(5, s.want);
    assertEquals(1, s.remaining);
    assertEquals(19, s.revision);
    assertTrue(e instanceof StockctlException.FailedPrecondition);
    StockctlException.LockLost l = (StockctlException.LockLost) StockctlException.from(io.grpc.Status.Code.FAILED_PRECONDITION, "",
        status("LOCK_LOST", com.github.stockctl.v1.LockLost.newBuilder().setName("n").setToken(9)
            .setReason(LostReason.LOST_REASON_SESSION_LOST).build()), null);
    assertEquals("n", l.name);
    assertEquals(9, l.token);
    assertEquals("SESSION_LOST", l.lostReason);
  }

  @Test
  public void withoutErrorInfoByCode() {
    StockctlException e = StockctlException.from(io.grpc.Status.Code.UNAVAILABLE, "refused", null, null);
    assertSame(StockctlException.Unavailable.class, e.getClass());
    assertTrue(e.retryable());
    assertEquals("", e.reason);
    assertSame(StockctlException.DeadlineExceeded.class,
        StockctlException.from(io.grpc.Status.Code.DEADLINE_EXCEEDED, "", null, null).getClass());
  }
}
