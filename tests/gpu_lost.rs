//! A GPU that fails between calls: a device fault leaves its context unusable (as a GPU that
//! faults or falls off the bus does), and every later query and sync of the mirror is a typed
//! error that names the GPU — never a panic or a hang — and dropping the mirror is clean. Its
//! own test binary (its own process), because the fault breaks the GPU's context for every
//! test of the process. Without a GPU it says why it was skipped.

mod common;

use common::small_opts;
use tusk::{BTreeOp, Commit, Error, GpuBackend, GpuOptions, Options, Store};

#[test]
fn a_gpu_lost_between_calls_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options { heap_capacity: 64 << 20, checkpoint_interval: None, ..small_opts() }).unwrap();
    let ops: Vec<BTreeOp> = (0..5000u64).map(|k| BTreeOp::Upsert { key: k * 3, value: k }).collect();
    store.transact(Commit::Async, |tx| tx.btree("orders")?.apply_batch(&ops).map(|_| ())).unwrap();
    let mut mirror = match store.gpu_mirror(GpuOptions { backend: GpuBackend::Cuda, ..GpuOptions::default() }) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("SKIPPED: no usable GPU: {e}");
            return;
        }
    };
    assert_eq!(mirror.btree("orders").unwrap().get_batch(&[3, 4]).unwrap().values, vec![Some(1), None]);
    let device = mirror.inner().device().expect("a CUDA mirror has a device");
    let name = format!("GPU {} (", device.ordinal());
    let fault = device.fail_for_tests();
    assert!(fault.to_string().contains(&name), "the fault names the GPU: {fault}");

    let names_it = |what: &str, e: Error| match e {
        Error::Gpu(msg) => assert!(msg.contains(&name), "{what}: the error names the GPU: {msg}"),
        other => panic!("{what}: a GPU error, not {other:?}"),
    };
    names_it("a lookup batch", mirror.btree("orders").unwrap().get_batch(&[3, 4]).unwrap_err());
    let mut buffers = match mirror.lookup_buffers(1000) {
        Ok(b) => Some(b),
        Err(e) => {
            names_it("caller buffers", e);
            None
        }
    };
    if let Some(b) = buffers.as_mut() {
        b.load_keys(&[3, 4]);
        names_it("a batch into caller buffers", mirror.btree("orders").unwrap().get_into(b).unwrap_err());
    }
    drop(buffers);
    store.transact(Commit::Async, |tx| tx.btree("orders")?.insert(1, 1).map(|_| ())).unwrap();
    names_it("a sync", mirror.sync().unwrap_err());
    // After a failed sync the mirror refuses queries, still naming why.
    names_it("a query after the failed sync", mirror.btree("orders").unwrap().get_batch(&[3]).unwrap_err());
    drop(mirror);
    // The store goes on without the mirror.
    assert_eq!(store.transact(Commit::Async, |tx| tx.btree("orders")?.get(3)).unwrap().0, Some(1));
}
