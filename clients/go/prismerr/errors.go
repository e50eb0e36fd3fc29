// Package prismerr holds the typed errors every package of the Go client returns.
//
// Each failure is an *Error with a stable Code (the same codes as the Python SDK's
// app/errors.py, which are also the worker's DLQ reasons), what went wrong, where, and how
// to fix it. Codes form the same hierarchy as Python's exception classes, so callers test
// for a family with errors.Is:
//
//	if errors.Is(err, prismerr.ErrSignature) { ... }   // bad_signature and every scope/ambiguity verdict
//	var pe *prismerr.Error
//	if errors.As(err, &pe) { log.Print(pe.Code, pe.Hint) }
//
// Decoders of untrusted input return these errors and never panic.
package prismerr

import "fmt"

// Error is a Prism failure: Code says which, What what happened, Path where (a field path
// or byte offset, may be empty) and Hint how to fix it. Err is the underlying cause, if any.
type Error struct {
	Code string
	What string
	Path string
	Hint string
	Err  error
}

func (e *Error) Error() string {
	s := e.Code + ": " + e.What
	if e.Path != "" {
		s += " (at " + e.Path + ")"
	}
	if e.Hint != "" {
		s += "; fix: " + e.Hint
	}
	return s
}

// Unwrap returns the cause, so errors.Is/As also see through to it.
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is a sentinel of this error's code or of one of its parent
// codes: errors.Is(legacyScopeErr, ErrSignature) is true, as LegacySignatureScopeError is a
// SignatureError in Python.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok || t.What != "" { // only sentinels (code only) match by code
		return false
	}
	for c := e.Code; c != ""; c = parents[c] {
		if c == t.Code {
			return true
		}
	}
	return false
}

// New builds an error of a code; hint may be empty.
func New(code, what, hint string) *Error { return &Error{Code: code, What: what, Hint: hint} }

// Newf builds an error of a code with a formatted message.
func Newf(code, format string, args ...any) *Error {
	return &Error{Code: code, What: fmt.Sprintf(format, args...)}
}

// At returns a copy of e with Path set.
func (e *Error) At(path string) *Error { c := *e; c.Path = path; return &c }

// WithHint returns a copy of e with Hint set.
func (e *Error) WithHint(hint string) *Error { c := *e; c.Hint = hint; return &c }

// Wrap returns a copy of e with its cause set.
func (e *Error) Wrap(cause error) *Error { c := *e; c.Err = cause; return &c }

// parents is the code hierarchy (app/errors.py's class tree).
var parents = map[string]string{
	"envelope_error":     "prism_error",
	"malformed_envelope": "envelope_error",
	"truncated":          "malformed_envelope",
	"wire_type":          "malformed_envelope",
	"bad_length":         "malformed_envelope",
	"bad_utf8":           "malformed_envelope",
	"too_large":          "envelope_error",
	"unknown_layout":     "envelope_error",
	"bad_compression":    "envelope_error",
	"payload_error":      "envelope_error",
	"invalid_envelope":   "envelope_error",

	"security_error":              "prism_error",
	"bad_signature":               "security_error",
	"unsupported_signature_scope": "bad_signature",
	"legacy_signature_scope":      "unsupported_signature_scope",
	"ambiguous_envelope":          "bad_signature",
	"unknown_key":                 "security_error",
	"key_not_usable":              "security_error",
	"key_provider_failed":         "security_error",
	"algorithm_not_allowed":       "security_error",
	"crypto_error":                "security_error",
	"decryption_failed":           "crypto_error",
	"encryption_failed":           "crypto_error",
	"audit_failed":                "crypto_error",
	"auth_failed":                 "security_error",
	"policy_violation":            "security_error",
	"delivery_audit_failed":       "security_error",

	"bad_config":               "prism_error",
	"bad_keyring":              "bad_config",
	"broker_error":             "prism_error",
	"bad_binding":              "prism_error",
	"schema_validation_failed": "prism_error",
	"schema_registry_error":    "prism_error",
}

func sentinel(code string) *Error { return &Error{Code: code} }

// Sentinels for errors.Is. Each matches its own code and every code below it.
var (
	ErrPrism       = sentinel("prism_error")
	ErrEnvelope    = sentinel("envelope_error")
	ErrDecode      = sentinel("malformed_envelope")
	ErrTruncated   = sentinel("truncated")
	ErrWireType    = sentinel("wire_type")
	ErrBadLength   = sentinel("bad_length")
	ErrUTF8        = sentinel("bad_utf8")
	ErrSizeLimit   = sentinel("too_large")
	ErrLayout      = sentinel("unknown_layout")
	ErrCompression = sentinel("bad_compression")
	ErrPayload     = sentinel("payload_error")
	ErrValidation  = sentinel("invalid_envelope")

	ErrSecurity          = sentinel("security_error")
	ErrSignature         = sentinel("bad_signature")
	ErrSignatureScope    = sentinel("unsupported_signature_scope")
	ErrLegacyScope       = sentinel("legacy_signature_scope")
	ErrAmbiguousEnvelope = sentinel("ambiguous_envelope")
	ErrUnknownKey        = sentinel("unknown_key")
	ErrKeyNotUsable      = sentinel("key_not_usable")
	ErrKeyProvider       = sentinel("key_provider_failed") // the key service (KMS) failed or refused: transient
	ErrAlgorithm         = sentinel("algorithm_not_allowed")
	ErrCrypto            = sentinel("crypto_error")
	ErrDecryption        = sentinel("decryption_failed")
	ErrEncryption        = sentinel("encryption_failed")
	ErrAudit             = sentinel("audit_failed")
	ErrAuth              = sentinel("auth_failed")
	ErrPolicy            = sentinel("policy_violation")
	ErrDeliveryAudit     = sentinel("delivery_audit_failed")

	ErrConfig           = sentinel("bad_config")
	ErrFormat           = sentinel("bad_input_format")
	ErrLNMP             = sentinel("bad_lnmp")
	ErrKeyring          = sentinel("bad_keyring")
	ErrBroker           = sentinel("broker_error")
	ErrBinding          = sentinel("bad_binding")
	ErrSchemaValidation = sentinel("schema_validation_failed")
	ErrRegistry         = sentinel("schema_registry_error")
	ErrSchemaReference  = sentinel("schema_reference_invalid")
)
