"""AsyncClient against a real serve: calls, a refusal's class, failover past a dead target, the feed."""

import asyncio
import unittest

import stockctl_client as sc

from . import env


class AsyncClientLive(unittest.TestCase):
    def test_async(self):
        env.need()

        async def main():
            sku = env.name("py-aio")
            async with sc.AsyncClient(env.TARGET, env.TOKEN) as c:
                await c.create_sku(sku, total=3, segments=1, initial_fill=3)
            # 127.0.0.1:1 refuses connections: the first attempt fails over to the serve.
            async with sc.AsyncClient(["127.0.0.1:1", env.TARGET], env.TOKEN) as c:
                a = await c.allocate(sku, sku + "-1", 2)
                self.assertFalse(a.replayed)
                self.assertEqual(c.targets[c._target()], env.TARGET)
                self.assertTrue((await c.allocate(sku, sku + "-1", 2)).replayed)
                with self.assertRaises(sc.SoldOut) as cm:
                    await c.allocate(sku, sku + "-2", 5)
                self.assertEqual(cm.exception.remaining, 1)
                self.assertEqual((await c.status(sku)).remaining, 1)
                got = []
                async for b in c.watch_orders(sku, since=a.revision - 1, timeout=60):
                    got += [(e.order, sc.kind(e)) for e in b.events]
                    if b.cursor >= a.revision:
                        break
                self.assertEqual(got, [(sku + "-1", "allocated")])
                skus = [s async for s in c.list_skus(page_size=2)]
                self.assertIn(sku, skus)
                self.assertEqual(skus, sorted(skus))
                self.assertIsNone(await c.next_expiry(sku))
                r = await c.reserve(sku, sku + "-r", 1, ttl=300)
                self.assertEqual(await c.next_expiry(sku), r.deadline.ToDatetime())
                await c.cancel(sku, sku + "-r")
                self.assertIsNone(await c.next_expiry(sku))
            if env.MERGED:  # a serve over two clusters names each SKU's
                async with sc.AsyncClient(env.MERGED, env.TOKEN) as c:
                    where = {s: cl async for s, cl in c.list_sku_clusters(page_size=1)}
                    self.assertEqual((where[env.SKU_A], where[env.SKU_B]), ("a", "b"))

        asyncio.run(main())


if __name__ == "__main__":
    unittest.main()
