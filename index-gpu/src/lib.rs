//! tusk-index: the B-link tree and the Adaptive Radix Tree stored in the transactional heap,
//! and their GPU mirror (DESIGN.md). The index structures arrive with issue 5 and the device
//! mirror with the GPU issue; this crate holds the folder's place in the dependency order
//! (storage → txn → recovery → index-gpu → tusk) and has no code yet.
