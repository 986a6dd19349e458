package e2e

import (
	"testing"

	"github.com/anishathalye/porcupine"
)

// Invariant: the model and the checker tell linearizable histories of one
// SKU from histories that are not (so that an Ok from the scenarios means
// something). Stock 5, total 5 at the start.
func TestLinearizabilityModel(t *testing.T) {
	alloc := func(client int, order string, qty int64, result string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: linInput{Op: opAllocate, Order: order, Qty: qty}, Output: linOutput{Result: result}, Call: call, Return: ret}
	}
	status := func(client int, avail, total int64, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: linInput{Op: opStatus}, Output: linOutput{Avail: avail, Total: total}, Call: call, Return: ret}
	}
	release := func(client int, order, result string, qty int64, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: linInput{Op: opRelease, Order: order}, Output: linOutput{Result: result, Qty: qty}, Call: call, Return: ret}
	}
	restock := func(client int, qty, total int64, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: linInput{Op: opRestock, Qty: qty}, Output: linOutput{Result: "ok", Total: total}, Call: call, Return: ret}
	}
	const never = 1 << 40
	for _, tc := range []struct {
		name string
		ops  []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"concurrent allocations within the stock", []porcupine.Operation{
			alloc(0, "a", 3, "ok", 0, 10), alloc(1, "b", 2, "ok", 1, 9), status(2, 0, 5, 11, 12)}, porcupine.Ok},
		{"oversell", []porcupine.Operation{
			alloc(0, "a", 3, "ok", 0, 10), alloc(1, "b", 3, "ok", 1, 9)}, porcupine.Illegal},
		{"refusal while stock remained", []porcupine.Operation{
			alloc(0, "a", 2, "ok", 0, 1), alloc(1, "b", 3, "insufficient", 2, 3)}, porcupine.Illegal},
		{"refusal concurrent with the allocation that took the stock", []porcupine.Operation{
			alloc(0, "a", 4, "ok", 0, 10), alloc(1, "b", 3, "insufficient", 1, 9)}, porcupine.Ok},
		{"stale status after an allocation returned", []porcupine.Operation{
			alloc(0, "a", 2, "ok", 0, 1), status(1, 5, 5, 2, 3)}, porcupine.Illegal},
		{"release returns the stock once", []porcupine.Operation{
			alloc(0, "a", 2, "ok", 0, 1), release(0, "a", "released", 2, 2, 3), release(1, "a", "already", 0, 4, 5), status(1, 5, 5, 6, 7)}, porcupine.Ok},
		{"double release", []porcupine.Operation{
			alloc(0, "a", 2, "ok", 0, 1), release(0, "a", "released", 2, 2, 3), release(1, "a", "released", 2, 4, 5)}, porcupine.Illegal},
		{"release of an order nobody allocated", []porcupine.Operation{
			release(0, "x", "released", 1, 0, 1)}, porcupine.Illegal},
		{"restock", []porcupine.Operation{
			restock(0, 4, 9, 0, 1), alloc(1, "a", 8, "ok", 2, 3), status(1, 1, 9, 4, 5)}, porcupine.Ok},
		{"an allocation whose reply was lost took effect later", []porcupine.Operation{
			alloc(0, "a", 3, "ok", 0, never), status(1, 5, 5, 1, 2), status(1, 2, 5, 3, 4)}, porcupine.Ok},
		{"an allocation whose reply was lost took effect twice", []porcupine.Operation{
			alloc(0, "a", 3, "ok", 0, never), status(1, 2, 5, 1, 2), alloc(1, "a", 3, "ok", 3, 4)}, porcupine.Illegal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := porcupine.CheckOperationsTimeout(linModel(5, 5), tc.ops, 0); got != tc.want {
				t.Fatalf("check = %s, want %s", got, tc.want)
			}
		})
	}
}
