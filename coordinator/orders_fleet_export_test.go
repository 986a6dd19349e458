package coordinator

// SetAcrossHook sets the hook a cross-cluster AllocateOrder runs between
// its reserves and its confirms (nil: none); it returns the undo.
func SetAcrossHook(f func(orderID string) error) func() {
	old := acrossHook
	acrossHook = f
	return func() { acrossHook = old }
}

// SetAcrossStepHook sets the hook a cross-cluster confirm runs at its steps
// ("decided", "confirm <cluster>"; nil: none); it returns the undo.
func SetAcrossStepHook(f func(orderID, step string) error) func() {
	old := acrossStepHook
	acrossStepHook = f
	return func() { acrossStepHook = old }
}
