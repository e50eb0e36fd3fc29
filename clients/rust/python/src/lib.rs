//! `prism_native`: the Python worker's compiled hot path, a thin PyO3 binding over
//! `prism-client` (the Rust client SDK's crate). Everything it computes is computed there
//! (and tested by `cargo test` there); this file only converts between Python and Rust.
//!
//! Optional by design: `app/native.py` imports it when it is installed and `PRISM_NATIVE` is
//! not `0`, and keeps the pure-Python implementation otherwise. Each function here must give
//! exactly what its Python twin gives, byte for byte and error class for error class
//! (tests/envelope/test_wire_native.py runs both on the conformance vectors and on generated
//! and hostile inputs).
//!
//! Failures cross as `WireFault(kind, at, field, wire_type, length, remaining)`, the numbers
//! as read; `app/native.py` words them as the `PrismError` the Python code raises. A panic
//! (there should be none: prism-client does not panic on bad input) is caught here and
//! crosses as a `WireFault` of kind `"internal"`, never as PyO3's `PanicException`.

use std::panic::{catch_unwind, AssertUnwindSafe};

use prism_client::wire::{self, WireFault};
use pyo3::buffer::PyBuffer;
use pyo3::create_exception;
use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

create_exception!(
    prism_native,
    WireFaultError,
    PyValueError,
    "A walk over protobuf records stopped: args are (kind, at, field, wire_type, length, remaining)."
);

/// Bumped whenever a function's contract changes: `app/native.py` uses the module only when
/// this is the version it was written for (a stale wheel in a venv falls back to Python).
const ABI: u32 = 1;

fn fault_error(py: Python<'_>, f: WireFault) -> PyErr {
    let none = py.None();
    let args: (&str, usize, Py<PyAny>, Py<PyAny>, Py<PyAny>, Py<PyAny>) = match f {
        WireFault::VarintPastEnd { at } => ("varint_past_end", at, none.clone_ref(py), none.clone_ref(py),
            none.clone_ref(py), none),
        WireFault::VarintTooLong { at } => ("varint_too_long", at, none.clone_ref(py), none.clone_ref(py),
            none.clone_ref(py), none),
        WireFault::InvalidField { at, field } => ("invalid_field", at, int(py, field), none.clone_ref(py),
            none.clone_ref(py), none),
        WireFault::LengthPastEnd { at, field, length, remaining } => ("length_past_end", at,
            int(py, u128::from(field)), none.clone_ref(py), int(py, length), int(py, remaining as u128)),
        WireFault::FixedPastEnd { at, field } => ("fixed_past_end", at, int(py, u128::from(field)),
            none.clone_ref(py), none.clone_ref(py), none),
        WireFault::BadWireType { at, field, wire_type } => ("bad_wire_type", at, int(py, u128::from(field)),
            int(py, u128::from(wire_type)), none.clone_ref(py), none),
    };
    WireFaultError::new_err(args)
}

fn int(py: Python<'_>, v: u128) -> Py<PyAny> {
    v.into_pyobject(py).expect("an int").into_any().unbind()
}

/// `scan` over a byte slice, as `app/envelope/wire.py`'s `scan` returns it: LEN records
/// carry their value's start, every other record its own start (the Python convention).
fn scan_slice<'py>(py: Python<'py>, buf: &[u8], start: isize, end: Option<isize>) -> PyResult<Bound<'py, PyList>> {
    let len = buf.len() as isize;
    let end = end.unwrap_or(len);
    if start < 0 || end < 0 || end > len {
        return Err(PyIndexError::new_err(format!(
            "scan range {start}..{end} is outside the buffer of {len} bytes"
        )));
    }
    if start >= end {
        return Ok(PyList::empty(py));
    }
    let walked = catch_unwind(AssertUnwindSafe(|| wire::walk(buf, start as usize, end as usize)));
    let records = match walked {
        Ok(Ok(records)) => records,
        Ok(Err(fault)) => return Err(fault_error(py, fault)),
        Err(_) => {
            return Err(WireFaultError::new_err(("internal", start as usize, py.None(), py.None(), py.None(),
                py.None())))
        }
    };
    let mut items = Vec::with_capacity(records.len());
    for r in records {
        let value_start = if r.wire_type == wire::LEN { r.value_start } else { r.start };
        items.push(PyTuple::new(py, [r.field as usize, r.wire_type as usize, r.start, value_start, r.end])?);
    }
    PyList::new(py, items)
}

/// All top-level records of `buf[start:end]` as `(field, wire_type, start, value_start, end)`
/// tuples: `app.envelope.wire.scan`, compiled. `buf` is `bytes` or any contiguous buffer
/// (`memoryview`, `bytearray`).
#[pyfunction]
#[pyo3(signature = (buf, start=0, end=None))]
fn scan<'py>(py: Python<'py>, buf: &Bound<'py, PyAny>, start: isize, end: Option<isize>) -> PyResult<Bound<'py, PyList>> {
    if let Ok(b) = buf.cast::<PyBytes>() {
        return scan_slice(py, b.as_bytes(), start, end);
    }
    let view = PyBuffer::<u8>::get(buf)?;
    if !view.is_c_contiguous() {
        return Err(PyValueError::new_err("scan needs a contiguous buffer"));
    }
    // SAFETY: the buffer is contiguous, of `len_bytes` u8 items, and `view` keeps it exported
    // (and the GIL is held) for as long as the slice is used, within this call.
    let slice = unsafe { std::slice::from_raw_parts(view.buf_ptr() as *const u8, view.len_bytes()) };
    scan_slice(py, slice, start, end)
}

#[pymodule]
fn prism_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("ABI", ABI)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("WireFault", m.py().get_type::<WireFaultError>())?;
    m.add_function(wrap_pyfunction!(scan, m)?)?;
    Ok(())
}
