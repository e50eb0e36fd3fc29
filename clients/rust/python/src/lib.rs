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

mod doc_check;

use prism_client::binding;
use prism_client::finish::{self, BatchFields, Pieces};
use prism_client::pair;
use prism_client::partition;
use prism_client::record_batch::{field_size, seal, BatchWriter, Fields, Tail, ESTIMATE_OVERHEAD};
use prism_client::signing::{self, locate_security_record, SecurityFault, SecurityRecord, StatementFault};
use prism_client::wire::{self, Record, WireFault};
use prism_client::Layout;
use pyo3::buffer::PyBuffer;
use pyo3::create_exception;
use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyList, PyString, PyTuple};

create_exception!(
    prism_native,
    WireFaultError,
    PyValueError,
    "A walk over protobuf records stopped: args are (kind, at, field, wire_type, length, remaining)."
);

create_exception!(
    prism_native,
    SecurityFaultError,
    PyValueError,
    "The security record is ambiguous: args are (kind, field, wire_type, expected, at)."
);

create_exception!(
    prism_native,
    StatementFaultError,
    PyValueError,
    "The signed message of a pair or batch scope cannot be formed: args are (kind, a, b)."
);

/// Bumped whenever a function's contract changes: `app/native.py` uses the module only when
/// this is the version it was written for (a stale wheel in a venv falls back to Python).
const ABI: u32 = 11;

/// What a fault says, as `WireFault`'s args: (kind, at, field, wire_type, length, remaining),
/// the numbers not given for a kind as None.
type FaultArgs = (
    &'static str,
    usize,
    Option<u128>,
    Option<u8>,
    Option<u128>,
    Option<usize>,
);

fn fault_args(f: WireFault) -> FaultArgs {
    match f {
        WireFault::VarintPastEnd { at } => ("varint_past_end", at, None, None, None, None),
        WireFault::VarintTooLong { at } => ("varint_too_long", at, None, None, None, None),
        WireFault::InvalidField { at, field } => ("invalid_field", at, Some(field), None, None, None),
        WireFault::LengthPastEnd {
            at,
            field,
            length,
            remaining,
        } => (
            "length_past_end",
            at,
            Some(field.into()),
            None,
            Some(length),
            Some(remaining),
        ),
        WireFault::FixedPastEnd { at, field } => ("fixed_past_end", at, Some(field.into()), None, None, None),
        WireFault::BadWireType { at, field, wire_type } => {
            ("bad_wire_type", at, Some(field.into()), Some(wire_type), None, None)
        }
    }
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
        Ok(Err(fault)) => return Err(WireFaultError::new_err(fault_args(fault))),
        Err(_) => {
            return Err(WireFaultError::new_err((
                "internal",
                start as usize,
                None::<u128>,
                None::<u8>,
                None::<u128>,
                None::<usize>,
            )))
        }
    };
    record_list(py, &records)
}

/// A record as `app/envelope/wire.py` gives it: LEN records carry their value's start, every
/// other record its own start (the Python convention).
fn record_tuple<'py>(py: Python<'py>, r: &Record) -> PyResult<Bound<'py, PyTuple>> {
    let value_start = if r.wire_type == wire::LEN {
        r.value_start
    } else {
        r.start
    };
    PyTuple::new(
        py,
        [r.field as usize, r.wire_type as usize, r.start, value_start, r.end],
    )
}

fn record_list<'py>(py: Python<'py>, records: &[Record]) -> PyResult<Bound<'py, PyList>> {
    let mut items = Vec::with_capacity(records.len());
    for r in records {
        items.push(record_tuple(py, r)?);
    }
    PyList::new(py, items)
}

/// The bytes of a `bytes` object or any contiguous buffer, for the length of `f`.
pub(crate) fn with_bytes<'py, T>(buf: &Bound<'py, PyAny>, f: impl FnOnce(&[u8]) -> PyResult<T>) -> PyResult<T> {
    let mut view = None;
    f(buffer_slice(buf, &mut view)?)
}

type SecurityArgs = (&'static str, u32, Option<u8>, Option<u8>, usize);

fn security_args(f: SecurityFault) -> SecurityArgs {
    match f {
        SecurityFault::RepeatedField { field, at } => ("repeated_field", field, None, None, at),
        SecurityFault::WrongWireType {
            field,
            wire_type,
            expected,
            at,
        } => ("wrong_wire_type", field, Some(wire_type), Some(expected), at),
        SecurityFault::RepeatedSecurityField { field, at } => ("repeated_security_field", field, None, None, at),
        SecurityFault::WrongSecurityWireType {
            field,
            wire_type,
            expected,
            at,
        } => ("wrong_security_wire_type", field, Some(wire_type), Some(expected), at),
        SecurityFault::Wire(_) => ("wire", 0, None, None, 0), // not reached: converted by the caller
    }
}

/// The one security record of envelope bytes in `reviewed` (else draft) layout after the
/// ambiguity checks (a fresh walk of `data`), or None when there is none; faults as the
/// Python errors `security_record` and `security_span` raise.
fn located(data: &[u8], reviewed: bool) -> PyResult<Option<SecurityRecord>> {
    let lay = if reviewed { Layout::Reviewed } else { Layout::Draft };
    let located = catch_unwind(AssertUnwindSafe(|| {
        let records = wire::walk(data, 0, data.len()).map_err(SecurityFault::Wire)?;
        locate_security_record(data, &records, lay)
    }));
    match located {
        Ok(Ok(found)) => Ok(found),
        Ok(Err(SecurityFault::Wire(fault))) => Err(WireFaultError::new_err(fault_args(fault))),
        Ok(Err(fault)) => Err(SecurityFaultError::new_err(security_args(fault))),
        Err(_) => {
            let internal: FaultArgs = ("internal", 0, None, None, None, None);
            Err(WireFaultError::new_err(internal))
        }
    }
}

/// `app.security.signing._security_record`, compiled: the one security record of envelope
/// bytes in `reviewed` (else draft) layout after the ambiguity checks, as
/// `(record, inner records, scope)`, or None when there is none. The top-level walk is done
/// here again (it is what the caller's `records` are). Faults: `WireFault` for records that
/// cannot be walked, `SecurityFault` for an ambiguous record.
#[pyfunction]
fn security_record<'py>(
    py: Python<'py>,
    buf: &Bound<'py, PyAny>,
    reviewed: bool,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    with_bytes(buf, |data| {
        let Some(sec) = located(data, reviewed)? else {
            return Ok(None);
        };
        let rec = record_tuple(py, &sec.rec)?;
        let inner = record_list(py, &sec.inner)?;
        Ok(Some(PyTuple::new(
            py,
            [
                rec.into_any(),
                inner.into_any(),
                sec.scope.into_pyobject(py)?.into_any(),
            ],
        )?))
    })
}

/// What `security_span` gives: the record's (value_start, end, scope), and the MAC when one
/// was asked for and the scope is one whose message `signed_mac` forms (v2 or legacy).
type Span<'py> = (usize, usize, u128, Option<Bound<'py, PyBytes>>);

/// `security_record` for a caller that needs only where the record's value lies and its
/// scope (the verifier of an envelope whose security context is already parsed):
/// `(value_start, end, scope, mac)` or None, the same checks and faults, without building a
/// tuple per inner record. With `secret`, and a scope of 2 (v2) or 0 (legacy), `mac` is
/// `signed_mac(buf, reviewed, secret)` from this same walk (else None): the verifier of an
/// HMAC signature with one candidate key then makes one call, not two.
#[pyfunction]
#[pyo3(signature = (buf, reviewed, secret=None))]
fn security_span<'py>(
    py: Python<'py>,
    buf: &Bound<'py, PyAny>,
    reviewed: bool,
    secret: Option<&[u8]>,
) -> PyResult<Option<Span<'py>>> {
    with_bytes(buf, |data| {
        let Some(sec) = located(data, reviewed)? else {
            return Ok(None);
        };
        let mac = match secret {
            Some(secret) if sec.scope == 0 || sec.scope == 2 => {
                let lay = if reviewed { Layout::Reviewed } else { Layout::Draft };
                let made = catch_unwind(AssertUnwindSafe(|| signing::signed_statement(data, &sec, lay)));
                let m = match made {
                    Ok(Ok(m)) => m,
                    Ok(Err(fault)) => return Err(stop_error(Stop::Statement(fault))),
                    Err(_) => return Err(stop_error(Stop::Panic)),
                };
                Some(PyBytes::new(py, &signing::hmac_sha256(secret, &m)))
            }
            _ => None,
        };
        Ok(Some((sec.rec.value_start, sec.rec.end, sec.scope, mac)))
    })
}

type StatementArgs = (&'static str, Option<u128>, Option<u128>, Option<&'static str>);

fn statement_args(f: StatementFault) -> StatementArgs {
    match f {
        StatementFault::NoSibling { scope } => ("no_sibling", None, None, Some(scope)),
        StatementFault::TreeSize { size } => ("tree_size", Some(size), None, None),
        StatementFault::TreeIndex { index, size } => ("tree_index", Some(index), Some(size), None),
        StatementFault::PathNotWhole { len } => ("path_not_whole", Some(len as u128), None, None),
        StatementFault::PathTooLong => ("path_too_long", None, None, None),
        StatementFault::PathTooShort => ("path_too_short", None, None, None),
        StatementFault::UnsupportedScope { scope } => ("unsupported_scope", Some(scope), None, None),
    }
}

/// What stopped the signed message: the walk, the ambiguity checks, or the statement.
enum Stop {
    Wire(prism_client::wire::WireFault),
    Security(SecurityFault),
    Statement(StatementFault),
    NotSigned,
    Panic,
}

fn stop_error(stop: Stop) -> PyErr {
    match stop {
        Stop::Wire(f) | Stop::Security(SecurityFault::Wire(f)) => WireFaultError::new_err(fault_args(f)),
        Stop::Security(f) => SecurityFaultError::new_err(security_args(f)),
        Stop::Statement(f) => StatementFaultError::new_err(statement_args(f)),
        Stop::NotSigned => StatementFaultError::new_err(("not_signed", None::<u128>, None::<u128>, None::<&str>)),
        Stop::Panic => WireFaultError::new_err((
            "internal",
            0usize,
            None::<u128>,
            None::<u8>,
            None::<u128>,
            None::<usize>,
        )),
    }
}

/// The signed message of envelope bytes in `reviewed` (else draft) layout, computed by
/// prism-client from a fresh walk (cheaper than taking the caller's records back).
fn message_of(data: &[u8], reviewed: bool) -> Result<Vec<u8>, Stop> {
    let lay = if reviewed { Layout::Reviewed } else { Layout::Draft };
    let made = catch_unwind(AssertUnwindSafe(|| {
        let records = wire::walk(data, 0, data.len()).map_err(Stop::Wire)?;
        let sec = locate_security_record(data, &records, lay)
            .map_err(Stop::Security)?
            .ok_or(Stop::NotSigned)?;
        signing::signed_statement(data, &sec, lay).map_err(Stop::Statement)
    }));
    made.unwrap_or(Err(Stop::Panic))
}

/// `b"".join(app.security.signing._message_parts(...))`, compiled: the message a signature
/// over these envelope bytes signs, in every scope the verifier knows (legacy, v2, pair,
/// batch). Faults: `StatementFault` (kind, a, b, scope name) for a pair or batch record that
/// yields no statement or an unknown scope, `WireFault`/`SecurityFault` for bytes the caller
/// should not have got this far with.
#[pyfunction]
fn signed_message<'py>(py: Python<'py>, buf: &Bound<'py, PyAny>, reviewed: bool) -> PyResult<Bound<'py, PyBytes>> {
    with_bytes(buf, |data| match message_of(data, reviewed) {
        Ok(m) => Ok(PyBytes::new(py, &m)),
        Err(stop) => Err(stop_error(stop)),
    })
}

/// HMAC-SHA256 under `secret` of `signed_message(buf, reviewed)`, in one call.
#[pyfunction]
fn signed_mac<'py>(
    py: Python<'py>,
    buf: &Bound<'py, PyAny>,
    reviewed: bool,
    secret: &[u8],
) -> PyResult<Bound<'py, PyBytes>> {
    with_bytes(buf, |data| match message_of(data, reviewed) {
        Ok(m) => Ok(PyBytes::new(py, &signing::hmac_sha256(secret, &m))),
        Err(stop) => Err(stop_error(stop)),
    })
}

/// `app.security.signing._pair_copies`' bytes work, compiled (prism-client's
/// `pair::pair_copies`): from a reviewed header serialized without its payload (signing
/// fields cleared) and the payload `Any`'s bytes (None when there is no payload),
/// `(head_reviewed, head_draft, security_draft, digest_draft, digest_reviewed, headers,
/// tracestate_pending)` with the batch scope's cut (else the pair scope's), or None when the
/// header is not one the shortcut converts byte for byte (the caller then takes the general
/// path, which gives the same bytes or words the error). `headers` are the Kafka binding's
/// envelope headers read from the same bytes (`pair::envelope_headers`: a list of
/// `(name, value)`, or None where the caller builds them), `tracestate_pending` whether the
/// caller must still check a `w3c.tracestate` entry: one call, so the publisher's `prepare`
/// reads no metadata field in Python. A panic crosses as `WireFault` of kind `"internal"`.
#[pyfunction]
#[pyo3(signature = (header, payload, batch))]
fn pair_copies<'py>(
    py: Python<'py>,
    header: &Bound<'py, PyAny>,
    payload: Option<&Bound<'py, PyAny>>,
    batch: bool,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let cut = if batch { pair::CUT_BATCH } else { pair::CUT_PAIR };
    let run = |full: &[u8], pay: Option<&[u8]>| -> PyResult<Option<Bound<'py, PyTuple>>> {
        let made = catch_unwind(AssertUnwindSafe(|| {
            pair::pair_copies(full, pay, cut).map(|c| (c, pair::envelope_headers(full)))
        }));
        let Ok(made) = made else {
            let internal: FaultArgs = ("internal", 0, None, None, None, None);
            return Err(WireFaultError::new_err(internal));
        };
        let Some((c, headers)) = made else { return Ok(None) };
        let (list, pending) = match headers {
            Some(h) => {
                let items = h
                    .headers
                    .iter()
                    .map(|(name, value)| {
                        PyTuple::new(
                            py,
                            [header_name(py, name).into_any(), PyBytes::new(py, value).into_any()],
                        )
                    })
                    .collect::<PyResult<Vec<_>>>()?;
                (PyList::new(py, items)?.into_any(), h.tracestate_pending)
            }
            None => (py.None().into_bound(py), false),
        };
        Ok(Some(PyTuple::new(
            py,
            [
                PyBytes::new(py, &c.head_reviewed).into_any(),
                PyBytes::new(py, &c.head_draft).into_any(),
                PyBytes::new(py, &c.security_draft).into_any(),
                PyBytes::new(py, &c.digest_draft).into_any(),
                PyBytes::new(py, &c.digest_reviewed).into_any(),
                list,
                PyBool::new(py, pending).to_owned().into_any(),
            ],
        )?))
    };
    with_bytes(header, |full| match payload {
        None => run(full, None),
        Some(p) => with_bytes(p, |pay| run(full, Some(pay))),
    })
}

/// The names `pair::envelope_headers` gives, as Python strings made once (a `str` built per
/// header and message was a measurable part of the call).
static HEADER_NAMES: PyOnceLock<Vec<(&'static str, Py<PyString>)>> = PyOnceLock::new();

fn header_name<'py>(py: Python<'py>, name: &'static str) -> Bound<'py, PyString> {
    let names = HEADER_NAMES.get_or_init(py, || {
        [
            binding::MESSAGE_ID,
            binding::TOPIC,
            binding::NAMESPACE,
            binding::TRACE_ID,
            binding::CONTENT_TYPE,
            binding::TRACEPARENT,
        ]
        .into_iter()
        .map(|n| (n, PyString::intern(py, n).unbind()))
        .collect()
    });
    match names.iter().find(|(n, _)| *n == name) {
        Some((_, s)) => s.bind(py).clone(),
        None => PyString::intern(py, name),
    }
}

/// The bytes of a `bytes` object or a contiguous buffer (`view` keeps the buffer exported
/// while the slice is used): a payload may be a `memoryview` of the received message.
fn buffer_slice<'a>(buf: &'a Bound<'_, PyAny>, view: &'a mut Option<PyBuffer<u8>>) -> PyResult<&'a [u8]> {
    if let Ok(b) = buf.cast::<PyBytes>() {
        return Ok(b.as_bytes());
    }
    let v = view.insert(PyBuffer::<u8>::get(buf)?);
    if !v.is_c_contiguous() {
        return Err(PyValueError::new_err("a contiguous buffer is needed"));
    }
    // SAFETY: the buffer is contiguous, of `len_bytes` u8 items, and `view` keeps it exported
    // (and the GIL is held) for as long as the slice, which borrows `view`, is used.
    Ok(unsafe { std::slice::from_raw_parts(v.buf_ptr() as *const u8, v.len_bytes()) })
}

/// `app.security.signing.finish_batch`, compiled (prism-client's `finish`): `items` are the
/// batch's prepared messages as `(digest_draft, digest_reviewed, pieces)`, `pieces` None or
/// `(layouts, head_draft, security_draft, head_reviewed, header_reviewed, payload)` from
/// `pair_copies` (`layouts`: one byte per copy wanted, 1 reviewed, 0 draft). Builds the
/// Merkle tree, calls `sign(statement)` once for the signature, and returns
/// `(signature, per message: its copies, or its audit path when it has no pieces or they
/// do not splice exactly and the caller must write it)`.
#[pyfunction]
fn finish_batch<'py>(
    py: Python<'py>,
    items: Vec<Bound<'py, PyTuple>>,
    sign: &Bound<'py, PyAny>,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyList>)> {
    fn digest<'a>(b: &'a Bound<'_, PyAny>) -> PyResult<&'a [u8; 32]> {
        let b = b.cast::<PyBytes>()?.as_bytes();
        b.try_into().map_err(|_| PyValueError::new_err("a digest is 32 bytes"))
    }
    let mut parts = Vec::with_capacity(items.len());
    for item in &items {
        let (d, r, p) = (
            item.get_borrowed_item(0)?,
            item.get_borrowed_item(1)?,
            item.get_borrowed_item(2)?,
        );
        parts.push((d.to_owned(), r.to_owned(), p.to_owned()));
    }
    let mut digests = Vec::with_capacity(parts.len());
    for (d, r, _) in &parts {
        digests.push((digest(d)?, digest(r)?));
    }
    let internal = || {
        let args: FaultArgs = ("internal", 0, None, None, None, None);
        WireFaultError::new_err(args)
    };
    let (root, paths) = catch_unwind(AssertUnwindSafe(|| finish::batch_tree(&digests)))
        .map_err(|_| internal())?
        .ok_or_else(|| PyValueError::new_err("a Merkle tree needs at least one leaf"))?;
    let size = digests.len() as u64;
    let statement = signing::batch_statement(size, &root);
    let signature = sign.call1((PyBytes::new(py, &statement),))?;
    let sig = signature.cast::<PyBytes>()?.as_bytes();
    let out = PyList::empty(py);
    for (i, ((pieces, path), (dd, rd))) in parts.iter().map(|t| &t.2).zip(&paths).zip(&digests).enumerate() {
        let fields = BatchFields {
            signature: sig,
            index: i as u64,
            size,
            path,
        };
        let done = if pieces.is_none() {
            None
        } else {
            let t = pieces.cast::<PyTuple>()?;
            let b = |k: usize| -> PyResult<Bound<'py, PyBytes>> { Ok(t.get_item(k)?.cast_into::<PyBytes>()?) };
            let (lays, hd, sd, hr, full) = (b(0)?, b(1)?, b(2)?, b(3)?, b(4)?);
            let payload = t.get_item(5)?;
            let mut view = None;
            let payload = if payload.is_none() {
                None
            } else {
                Some(buffer_slice(&payload, &mut view)?)
            };
            let p = Pieces {
                head_draft: hd.as_bytes(),
                security_draft: sd.as_bytes(),
                head_reviewed: hr.as_bytes(),
                header_reviewed: full.as_bytes(),
                payload,
                digest_draft: dd,
                digest_reviewed: rd,
            };
            let reviewed: Vec<bool> = lays.as_bytes().iter().map(|&l| l != 0).collect();
            catch_unwind(AssertUnwindSafe(|| finish::finish_message(&p, &reviewed, &fields))).map_err(|_| internal())?
        };
        match done {
            Some(copies) => out.append(PyList::new(py, copies.iter().map(|c| PyBytes::new(py, c)))?)?,
            None => out.append(PyBytes::new(py, path))?,
        }
    }
    Ok((signature, out))
}

/// All top-level records of `buf[start:end]` as `(field, wire_type, start, value_start, end)`
/// tuples: `app.envelope.wire.scan`, compiled. `buf` is `bytes` or any contiguous buffer
/// (`memoryview`, `bytearray`).
#[pyfunction]
#[pyo3(signature = (buf, start=0, end=None))]
fn scan<'py>(
    py: Python<'py>,
    buf: &Bound<'py, PyAny>,
    start: isize,
    end: Option<isize>,
) -> PyResult<Bound<'py, PyList>> {
    with_bytes(buf, |data| scan_slice(py, data, start, end))
}

/// Kafka's key hash, `aiokafka.partitioner.murmur2` compiled (prism-client's
/// `partition::murmur2`, the Java client's `Utils.murmur2`): the same unsigned 32-bit value
/// for every input. `data` is `bytes` or any contiguous buffer. Why: the worker places every
/// keyed output record itself (`app/worker/batch_send.py`), and the pure-Python hash of a
/// 36-byte key costs ~4 µs, twice per message.
#[pyfunction]
fn murmur2(data: &Bound<'_, PyAny>) -> PyResult<u32> {
    with_bytes(data, |d| Ok(partition::murmur2(d)))
}

/// One record's key, value or header value: None is Kafka's null, anything else `bytes` or a
/// contiguous buffer (what aiokafka's builder takes).
fn batch_field(w: &mut impl Fields, obj: &Bound<'_, PyAny>) -> PyResult<()> {
    if obj.is_none() {
        w.bytes(None);
        Ok(())
    } else {
        with_bytes(obj, |b| {
            w.bytes(Some(b));
            Ok(())
        })
    }
}

/// A record's headers (`(str, bytes or None)` pairs), in the batch's order: their count, then
/// each one's key and value.
fn header_fields(w: &mut impl Fields, headers: &Bound<'_, PyAny>) -> PyResult<()> {
    w.count(headers.len()?);
    for h in headers.try_iter()? {
        let h = h?;
        let h = h.cast::<PyTuple>()?;
        if h.len() != 2 {
            return Err(PyValueError::new_err("a header is a (key, value) pair"));
        }
        let key = h.get_borrowed_item(0)?;
        w.bytes(Some(key.cast::<PyString>()?.to_str()?.as_bytes()));
        batch_field(w, &*h.get_borrowed_item(1)?)?;
    }
    Ok(())
}

/// The bytes a record's key or value takes in a record batch (its length prefix included).
fn field_size_of(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    if obj.is_none() {
        Ok(field_size(None))
    } else {
        with_bytes(obj, |b| Ok(field_size(Some(b.len()))))
    }
}

/// A record's headers (`(str, bytes or None)` pairs) as a record batch holds them - their count,
/// then each one's key and value - for `record_batch` to copy as they are, and the record's size
/// as aiokafka's `DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers)` gives
/// it: `(size, tail)`. `key` and `value` are None or `bytes` (or contiguous buffers); only their
/// lengths are read. Why: the worker's size fit measures every output right after the batch is
/// signed, while the record's header objects are in the CPU's caches; the send, a batch later,
/// read them again when they had left the caches (`app/worker/size_fit.py`, issue 29).
/// The key and the value are one object each and are read by the send: writing them ahead
/// as well cost more at the fit than it saved at the send.
#[pyfunction]
fn record_tail<'py>(
    py: Python<'py>,
    key: &Bound<'py, PyAny>,
    value: &Bound<'py, PyAny>,
    headers: &Bound<'py, PyAny>,
) -> PyResult<(usize, Bound<'py, PyBytes>)> {
    thread_local! {
        // one buffer whose capacity outlives the call: the tail is copied out of it
        static TAIL: std::cell::RefCell<Tail> = std::cell::RefCell::new(Tail::default());
    }
    let fixed = ESTIMATE_OVERHEAD + field_size_of(key)? + field_size_of(value)?;
    let write = |t: &mut Tail| -> PyResult<(usize, Bound<'py, PyBytes>)> {
        t.clear();
        header_fields(t, headers)?;
        Ok((fixed + t.as_bytes().len(), PyBytes::new(py, t.as_bytes())))
    };
    TAIL.with(|cell| match cell.try_borrow_mut() {
        Ok(mut t) => write(&mut t),
        // re-entered (a header sequence's Python code called this again): a buffer of its own
        Err(_) => write(&mut Tail::default()),
    })
}

/// aiokafka's "now" for a record without a timestamp: Unix milliseconds.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// One Kafka v2 record batch (uncompressed) of `records[start:]`, as many as fit, written as
/// aiokafka's `DefaultRecordBatchBuilder` writes them (prism-client's `record_batch`): returns
/// `(batch, count)`, the batch a `bytearray` to give `seal_batch` once its producer state is
/// known, `count` the records it took (at least one: a record that would make the batch reach
/// `batch_size` bytes is left for the next batch, except the first). `records` are the worker's
/// `OutRecord`s, `(topic, key, value, timestamp_ms or None, headers, size)`; only key, value,
/// timestamp (None: now) and headers (`(str, bytes or None)` pairs) are read. Why: one call per
/// batch instead of a Python builder call per record (`app/worker/batch_send.py`, issue 29).
#[pyfunction]
fn record_batch<'py>(
    py: Python<'py>,
    records: &Bound<'py, PyList>,
    start: usize,
    batch_size: usize,
    transactional: bool,
) -> PyResult<(Bound<'py, PyByteArray>, usize)> {
    let n = records.len();
    if start >= n {
        return Err(PyIndexError::new_err("no record at start"));
    }
    thread_local! {
        // One writer whose buffers outlive the call (`BatchWriter::restart`: fresh 256 KiB
        // buffers per batch cost more in page faults than the records' writing).
        static WRITER: std::cell::RefCell<BatchWriter> = std::cell::RefCell::new(BatchWriter::new(0, false));
    }
    WRITER.with(|cell| match cell.try_borrow_mut() {
        Ok(mut w) => write_batch(py, &mut w, records, start, batch_size, transactional),
        // re-entered (a header sequence's Python code called this again): a writer of its own
        Err(_) => write_batch(
            py,
            &mut BatchWriter::new(0, false),
            records,
            start,
            batch_size,
            transactional,
        ),
    })
}

fn write_batch<'py>(
    py: Python<'py>,
    w: &mut BatchWriter,
    records: &Bound<'py, PyList>,
    start: usize,
    batch_size: usize,
    transactional: bool,
) -> PyResult<(Bound<'py, PyByteArray>, usize)> {
    let n = records.len();
    w.restart(batch_size, transactional);
    for i in start..n {
        let rec = records.get_item(i)?;
        let rec = rec.cast::<PyTuple>()?;
        let ts = rec.get_borrowed_item(3)?;
        w.begin(if ts.is_none() { now_ms() } else { ts.extract::<i64>()? });
        let tail = if rec.len() > 6 {
            Some(rec.get_borrowed_item(6)?)
        } else {
            None
        };
        batch_field(w, &*rec.get_borrowed_item(1)?)?;
        batch_field(w, &*rec.get_borrowed_item(2)?)?;
        match tail {
            Some(t) if !t.is_none() => with_bytes(&t, |b| {
                w.tail(b);
                Ok(())
            })?,
            _ => header_fields(w, &*rec.get_borrowed_item(4)?)?,
        }
        if !w.commit() {
            break;
        }
    }
    let count = w.records();
    Ok((PyByteArray::new(py, w.finish()), count))
}

/// Write the producer state (id, epoch, base sequence) and the CRC-32C into a batch from
/// `record_batch`, in place: what aiokafka's builder writes when the producer drains the batch.
#[pyfunction]
fn seal_batch(
    batch: &Bound<'_, PyByteArray>,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
) -> PyResult<()> {
    // SAFETY: the GIL is held, and nothing runs Python code or resizes the bytearray while the
    // slice is used (only within `seal`).
    let bytes = unsafe { batch.as_bytes_mut() };
    if seal(bytes, producer_id, producer_epoch, base_sequence) {
        Ok(())
    } else {
        Err(PyValueError::new_err("not a record batch: shorter than a batch header"))
    }
}

#[pymodule]
fn prism_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("ABI", ABI)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("WireFault", m.py().get_type::<WireFaultError>())?;
    m.add("SecurityFault", m.py().get_type::<SecurityFaultError>())?;
    m.add("StatementFault", m.py().get_type::<StatementFaultError>())?;
    m.add_function(wrap_pyfunction!(scan, m)?)?;
    m.add_function(wrap_pyfunction!(security_record, m)?)?;
    m.add_function(wrap_pyfunction!(security_span, m)?)?;
    m.add_function(wrap_pyfunction!(signed_message, m)?)?;
    m.add_function(wrap_pyfunction!(signed_mac, m)?)?;
    m.add_function(wrap_pyfunction!(pair_copies, m)?)?;
    m.add_function(wrap_pyfunction!(finish_batch, m)?)?;
    m.add_function(wrap_pyfunction!(murmur2, m)?)?;
    m.add_function(wrap_pyfunction!(record_tail, m)?)?;
    m.add_function(wrap_pyfunction!(record_batch, m)?)?;
    m.add_function(wrap_pyfunction!(seal_batch, m)?)?;
    m.add_class::<doc_check::DocPlan>()?;
    Ok(())
}
