// Package signing signs and verifies Prism envelope signatures (HMAC-SHA256 and Ed25519)
// in every scope of docs/signing.md: v2 (the SDK default), pair (one signature over both
// layouts' copies), batch (one signature over a Merkle tree of a batch; each copy carries
// its audit path) and, only when explicitly accepted, legacy.
//
// Verification cuts the signed bytes from the received bytes, never from a re-encoding:
// protobuf encodings are not canonical.
package signing

import (
	"container/list"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"math/bits"
	"strconv"
	"sync"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/gen/draftpb"
	"github.com/prism-envelope/prism/clients/go/gen/reviewedpb"
	"github.com/prism-envelope/prism/clients/go/prismerr"
	"google.golang.org/protobuf/proto"
)

// Scope is a security.signature_scope value (the same numbers in both layouts).
type Scope uint64

// Scopes.
const (
	ScopeLegacy Scope = 0
	ScopeV2     Scope = 2
	ScopePair   Scope = 3
	ScopeBatch  Scope = 4
)

func (s Scope) String() string {
	switch s {
	case ScopeLegacy:
		return "legacy"
	case ScopeV2:
		return "v2"
	case ScopePair:
		return "pair"
	case ScopeBatch:
		return "batch"
	}
	return "unknown"
}

// Context strings that start each scope's signed message (docs/signing.md, step 5).
var (
	V2ContextDraft    = []byte("prism-envelope-signature/v2/draft\x00")
	V2ContextReviewed = []byte("prism-envelope-signature/v2/reviewed\x00")
	PairContext       = []byte("prism-envelope-signature/pair\x00")
	BatchContext      = []byte("prism-envelope-signature/batch\x00")
)

// MaxTreeSize is the largest batch one batch-scope signature may cover.
const MaxTreeSize = 65536

// DigestBytes is the length of sibling_digest and of each audit-path hash.
const DigestBytes = 32

const (
	secAuthToken = 3
	secSignature = 4
	secScope     = 10
	secSibling   = 11
	secTreeIndex = 12
	secTreeSize  = 13
	secTreePath  = 14
)

var (
	cutV2    = map[int]bool{secAuthToken: true, secSignature: true}
	cutPair  = map[int]bool{secAuthToken: true, secSignature: true, secSibling: true}
	cutBatch = map[int]bool{secAuthToken: true, secSignature: true, secSibling: true, secTreeIndex: true, secTreeSize: true, secTreePath: true}
)

// secWire: SecurityContext fields and their wire types (identical in both layouts).
var secWire = map[int]int{1: 2, 2: 2, 3: 2, 4: 2, 5: 2, 6: 2, 7: 0, 8: 2, 9: 2, 10: 0, 11: 2, 12: 0, 13: 0, 14: 2}
var secNames = map[int]string{1: "publisher_id", 2: "publisher_team", 3: "auth_token", 4: "signature", 5: "signature_algorithm",
	6: "encryption", 7: "contains_pii", 8: "data_classification", 9: "signature_key_id", 10: "signature_scope",
	11: "sibling_digest", 12: "tree_index", 13: "tree_size", 14: "tree_path"}

type singular struct {
	name string
	wt   int
}

var topSingular = map[envelope.Layout]map[int]singular{
	envelope.Draft: {1: {"envelope_version", 0}, 2: {"metadata", 2}, 3: {"payload", 2}, 4: {"security", 2},
		5: {"observability", 2}, 6: {"schema", 2}},
	envelope.Reviewed: {1: {"metadata", 2}, 2: {"security", 2}, 3: {"observability", 2}, 4: {"schema", 2}, 99: {"payload", 2}},
}

func quote(s string) string { b, _ := json.Marshal(s); return string(b) }

func mac(secret, m []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write(m)
	return h.Sum(nil)
}

func v2Context(lay envelope.Layout) []byte {
	if lay == envelope.Draft {
		return V2ContextDraft
	}
	return V2ContextReviewed
}

// Info says what verified: the key, its algorithm and the scope.
type Info struct {
	KeyID     string
	Algorithm string
	Scope     Scope
}

// ---------------------------------------------------------------- received bytes

// parsed is what the ambiguity checks found in received bytes.
type parsed struct {
	data   []byte
	lay    envelope.Layout
	recs   []envelope.Record
	sec    envelope.Record // the security record (zero when absent)
	hasSec bool
	inner  []envelope.Record // its records, offsets into data
	scope  Scope
}

func parse(data []byte, lay envelope.Layout, required bool) (*parsed, error) {
	return parseWithin(data, lay, required, nil)
}

// parseWithin is parse with the header limit applied while the records are walked
// (envelope.ScanEnvelope); limits nil: no limit.
func parseWithin(data []byte, lay envelope.Layout, required bool, limits *envelope.Limits) (*parsed, error) {
	var recs []envelope.Record
	var err error
	if limits != nil {
		recs, err = envelope.ScanEnvelope(data, lay, limits.MaxHeaderBytes)
	} else {
		recs, err = envelope.Scan(data)
	}
	if err != nil {
		return nil, err
	}
	if lay == envelope.Auto {
		if lay, err = envelope.LayoutOfRecords(recs); err != nil {
			return nil, err
		}
	}
	p := &parsed{data: data, lay: lay, recs: recs}
	spec := topSingular[lay]
	seen := map[int]bool{}
	for _, r := range recs {
		s, ok := spec[r.Field]
		if !ok {
			continue
		}
		if seen[r.Field] {
			return nil, prismerr.Newf("ambiguous_envelope", "%s (field %d) appears more than once in the envelope; protobuf would merge the copies, so what was signed and what is read could differ", s.name, r.Field).
				At("byte " + itoa(r.Start)).WithHint("a producer writes each context once; a second copy was appended or the encoder is broken")
		}
		if r.WireType != s.wt {
			return nil, prismerr.Newf("ambiguous_envelope", "%s (field %d) has wire type %d, not %d", s.name, r.Field, r.WireType, s.wt).
				At("byte " + itoa(r.Start)).WithHint("the bytes are not an envelope of this layout")
		}
		seen[r.Field] = true
		if r.Field == lay.SecurityField() {
			p.sec, p.hasSec = r, true
		}
	}
	if !p.hasSec {
		if required {
			return nil, notSigned("envelope is not signed (no security context)")
		}
		return p, nil
	}
	inner, err := envelope.Scan(data[p.sec.ValueStart:p.sec.End])
	if err != nil {
		return nil, err
	}
	off := p.sec.ValueStart
	fields := map[int]bool{}
	for i := range inner {
		r := &inner[i]
		r.Start, r.ValueStart, r.End = r.Start+off, r.ValueStart+off, r.End+off
		want, known := secWire[r.Field]
		if !known {
			continue // an unknown (newer) field: covered byte for byte
		}
		name := secNames[r.Field]
		if fields[r.Field] {
			return nil, prismerr.New("ambiguous_envelope", "security."+name+" appears more than once in the security context",
				"each security field is written once").At("byte " + itoa(r.Start))
		}
		if r.WireType != want {
			return nil, prismerr.Newf("ambiguous_envelope", "security.%s has wire type %d, not %d", name, r.WireType, want).
				At("byte " + itoa(r.Start)).WithHint("the security context is malformed")
		}
		fields[r.Field] = true
		if r.Field == secScope {
			p.scope = Scope(envelope.VarintValue(data, *r))
		}
	}
	p.inner = inner
	return p, nil
}

func itoa(n int) string { return strconv.Itoa(n) }

func notSigned(what string) error {
	return prismerr.New("bad_signature", what, "sign it in the producer, or set the namespace's signature policy to optional").At("security.signature")
}

// reframe returns the security record with the cut fields' records removed, the rest byte
// for byte in received order, re-framed with the minimal tag and length.
func (p *parsed) reframe(cut map[int]bool) []byte {
	body := make([]byte, 0, p.sec.End-p.sec.ValueStart)
	run := p.sec.ValueStart
	for _, r := range p.inner {
		if cut[r.Field] {
			body = append(body, p.data[run:r.Start]...)
			run = r.End
		}
	}
	body = append(body, p.data[run:p.sec.End]...)
	out := envelope.AppendVarint(make([]byte, 0, len(body)+4), uint64(p.lay.SecurityField()<<3|envelope.WireLen))
	out = envelope.AppendVarint(out, uint64(len(body)))
	return append(out, body...)
}

func (p *parsed) field(f int) (envelope.Record, bool) {
	for _, r := range p.inner {
		if r.Field == f {
			return r, true
		}
	}
	return envelope.Record{}, false
}

// digests returns this copy's digest (cut of the given fields) and the sibling's.
func (p *parsed) digests(cut map[int]bool, scope string) (own, other []byte, err error) {
	r, ok := p.field(secSibling)
	if !ok || r.End-r.ValueStart != DigestBytes {
		return nil, nil, prismerr.Newf("bad_signature", "%s-scope signature without a %d-byte sibling_digest", scope, DigestBytes).
			At("security.sibling_digest").WithHint("the envelope was changed after signing, or its producer is broken")
	}
	h := sha256.New()
	h.Write(p.data[:p.sec.Start])
	h.Write(p.reframe(cut))
	h.Write(p.data[p.sec.End:])
	return h.Sum(nil), p.data[r.ValueStart:r.End], nil
}

// message is M, the signed message of the declared scope.
func (p *parsed) message() ([]byte, error) {
	d := p.data
	switch p.scope {
	case ScopeLegacy:
		return concat(d[:p.sec.Start], d[p.sec.End:]), nil
	case ScopeV2:
		return concat(v2Context(p.lay), d[:p.sec.Start], p.reframe(cutV2), d[p.sec.End:]), nil
	case ScopePair:
		own, other, err := p.digests(cutPair, "pair")
		if err != nil {
			return nil, err
		}
		if p.lay == envelope.Draft {
			return concat(PairContext, own, other), nil
		}
		return concat(PairContext, other, own), nil
	case ScopeBatch:
		var index, size uint64
		var path []byte
		for _, r := range p.inner {
			switch r.Field {
			case secTreeIndex:
				index = envelope.VarintValue(d, r)
			case secTreeSize:
				size = envelope.VarintValue(d, r)
			case secTreePath:
				path = d[r.ValueStart:r.End]
			}
		}
		own, other, err := p.digests(cutBatch, "batch")
		if err != nil {
			return nil, err
		}
		var leaf []byte
		if p.lay == envelope.Draft {
			leaf = LeafHash(own, other)
		} else {
			leaf = LeafHash(other, own)
		}
		root, err := RootFromPath(leaf, index, size, path)
		if err != nil {
			return nil, err
		}
		return BatchStatement(size, root), nil
	}
	return nil, prismerr.Newf("unsupported_signature_scope", "signature scope %d is not supported by this verifier", uint64(p.scope)).
		At("security.signature_scope").WithHint("supported: 0 (legacy), 2 (v2), 3 (pair), 4 (batch); upgrade the verifier or have the producer sign with scope v2")
}

func concat(parts ...[]byte) []byte {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	out := make([]byte, 0, n)
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// SignedMessage returns M, the bytes the signature on received envelope bytes covers per the
// scope they declare (docs/signing.md, steps 1-5), and that scope. layout may be Auto.
func SignedMessage(data []byte, layout envelope.Layout) ([]byte, Scope, error) {
	p, err := parse(data, layout, true)
	if err != nil {
		return nil, 0, err
	}
	m, err := p.message()
	return m, p.scope, err
}

// CheckUnambiguous fails with ErrAmbiguousEnvelope if the bytes repeat a singular top-level
// field or a security field, or give one the wrong wire type, also for unsigned envelopes
// (otherwise an appended security record could make a signed envelope look unsigned).
func CheckUnambiguous(data []byte, layout envelope.Layout) error {
	_, err := parse(data, layout, false)
	return err
}

// VerifyOptions tune Verify. AcceptLegacyScope, when set, overrides Keys.AcceptLegacyScope.
type VerifyOptions struct {
	Layout            envelope.Layout
	AcceptLegacyScope *bool
	Limits            *envelope.Limits // VerifyAndDecode: nil means envelope.DefaultLimits
}

// Verify checks the signature on received envelope bytes. Errors (errors.Is):
// prismerr.ErrSignature if it is missing, malformed or wrong (compared in constant time),
// ErrUnknownKey if the named key is not trusted, ErrAmbiguousEnvelope for ambiguous records,
// ErrLegacyScope for a legacy-scope signature unless accepted, ErrSignatureScope for an
// unknown scope, ErrDecode when the security context is not valid protobuf.
func Verify(data []byte, keys *Keys, opts VerifyOptions) (Info, error) {
	p, err := parse(data, opts.Layout, true)
	if err != nil {
		return Info{}, err
	}
	sig, alg, keyID, err := p.securityFields()
	if err != nil {
		return Info{}, err
	}
	return p.verify(sig, alg, keyID, keys, opts)
}

// VerifyAndDecode checks the records for ambiguity, decodes (within the size limits) and
// verifies, in one pass over the records: what a consumer normally wants.
func VerifyAndDecode(data []byte, keys *Keys, opts VerifyOptions) (*envelope.Envelope, Info, error) {
	limits := envelope.DefaultLimits
	if opts.Limits != nil {
		limits = *opts.Limits
	}
	// the limits before the walk: a record costs ~40 bytes of memory, its input as little as 2
	if len(data) > limits.MaxMessageBytes {
		return nil, Info{}, prismerr.Newf("too_large", "envelope is %d bytes, over the %d-byte limit", len(data), limits.MaxMessageBytes)
	}
	p, err := parseWithin(data, opts.Layout, true, &limits)
	if err != nil {
		return nil, Info{}, err
	}
	env, _, err := envelope.DecodeRecords(data, p.recs, p.lay, limits)
	if err != nil {
		return nil, Info{}, err
	}
	sig, alg, keyID, err := p.securityFields()
	if err != nil {
		return nil, Info{}, err
	}
	info, err := p.verify(sig, alg, keyID, keys, opts)
	if err != nil {
		return nil, Info{}, err
	}
	return env, info, nil
}

// securityFields parses the security context with the layout's schema (nested encryption and
// UTF-8 included): a context that does not parse is malformed whatever its scope.
func (p *parsed) securityFields() (sig []byte, alg, keyID string, err error) {
	value := p.data[p.sec.ValueStart:p.sec.End]
	opts := proto.UnmarshalOptions{RecursionLimit: 100}
	if p.lay == envelope.Draft {
		s := &draftpb.SecurityContext{}
		if e := opts.Unmarshal(value, s); e != nil {
			return nil, "", "", (&prismerr.Error{Code: "malformed_envelope", What: "security context is not valid protobuf: " + e.Error(), Path: "security"}).Wrap(e)
		}
		return s.Signature, s.SignatureAlgorithm, s.SignatureKeyId, nil
	}
	s := &reviewedpb.SecurityContext{}
	if e := opts.Unmarshal(value, s); e != nil {
		return nil, "", "", (&prismerr.Error{Code: "malformed_envelope", What: "security context is not valid protobuf: " + e.Error(), Path: "security"}).Wrap(e)
	}
	return s.Signature, s.GetSignatureAlgorithm(), s.GetSignatureKeyId(), nil
}

func (p *parsed) verify(sig []byte, alg, keyID string, keys *Keys, opts VerifyOptions) (Info, error) {
	if len(sig) == 0 {
		return Info{}, notSigned("envelope is not signed")
	}
	if keys == nil { // no keyring: nothing is trusted (unknown_key), never a nil dereference
		keys = &Keys{}
	}
	accept := keys.AcceptLegacyScope
	if opts.AcceptLegacyScope != nil {
		accept = *opts.AcceptLegacyScope
	}
	if p.scope == ScopeLegacy && !accept {
		return Info{}, prismerr.New("legacy_signature_scope",
			"envelope is signed with the legacy scope, which does not cover its security context (publisher, classification, PII flag, encryption metadata could have been changed)",
			"sign with scope v2 (the SDK default), or accept the legacy scope while old producers migrate (a downgrade risk: docs/signing.md)").At("security.signature_scope")
	}
	m, err := p.message()
	if err != nil {
		return Info{}, err
	}
	return check(sig, alg, keyID, m, keys, p.scope)
}

func check(sig []byte, alg, keyID string, m []byte, keys *Keys, scope Scope) (Info, error) {
	if alg != HMACSHA256 && alg != Ed25519 {
		return Info{}, prismerr.New("algorithm_not_allowed", "signature algorithm "+quote(alg)+" is not supported",
			"use hmac-sha256 or ed25519").At("security.signature_algorithm")
	}
	candidates, err := keys.candidates(keyID, alg)
	if err != nil {
		return Info{}, err
	}
	var entry string
	if scope == ScopeBatch {
		entry = alg + "\x00" + keyID + "\x00" + string(m) + "\x00" + string(sig)
		if k := cache.get(entry, candidates); k != nil {
			return Info{k.KeyID, alg, scope}, nil
		}
	}
	for _, k := range candidates {
		var ok bool
		if alg == HMACSHA256 {
			// a key built without NewHMACKey (VerificationKey is a plain struct) may hold an
			// empty or short secret - an empty one makes HMAC forgeable by anyone
			if len(k.Secret) < MinHMACKeyBytes {
				return Info{}, prismerr.Newf("bad_keyring", "hmac-sha256 key %q is %d bytes; at least %d are required", k.KeyID, len(k.Secret), MinHMACKeyBytes).
					At("security.signature_key_id").WithHint("build verification keys with NewHMACKey(...).VerificationKey(), from 32+ random bytes")
			}
			ok = hmac.Equal(mac(k.Secret, m), sig)
		} else {
			ok = len(k.PublicKey) == ed25519.PublicKeySize && ed25519.Verify(k.PublicKey, m, sig)
		}
		if ok {
			if entry != "" {
				cache.put(entry, k)
			}
			return Info{k.KeyID, alg, scope}, nil
		}
	}
	return Info{}, prismerr.New("bad_signature", "signature does not match the envelope (forged or tampered)",
		"the bytes changed after signing, or the producer used a different key").At("security.signature")
}

// ---------------------------------------------------------------- Merkle tree (RFC 9162)

// LeafHash is a message's Merkle leaf: SHA-256(0x00 || D(draft) || D(reviewed)).
func LeafHash(draftDigest, reviewedDigest []byte) []byte {
	h := sha256.New()
	h.Write([]byte{0})
	h.Write(draftDigest)
	h.Write(reviewedDigest)
	return h.Sum(nil)
}

func node(left, right []byte) []byte {
	h := sha256.New()
	h.Write([]byte{1})
	h.Write(left)
	h.Write(right)
	return h.Sum(nil)
}

// MerkleTree returns the RFC 9162 §2.1.1 root over leaf hashes and every leaf's audit path
// (its hashes concatenated, nearest the leaf first).
func MerkleTree(leaves [][]byte) ([]byte, [][]byte) {
	paths := make([][]byte, len(leaves))
	var mth func(lo, hi int) []byte
	mth = func(lo, hi int) []byte {
		if hi-lo == 1 {
			return leaves[lo]
		}
		k := 1 << (bits.Len(uint(hi-lo-1)) - 1)
		left, right := mth(lo, lo+k), mth(lo+k, hi)
		for i := lo; i < lo+k; i++ {
			paths[i] = append(paths[i], right...)
		}
		for i := lo + k; i < hi; i++ {
			paths[i] = append(paths[i], left...)
		}
		return node(left, right)
	}
	return mth(0, len(leaves)), paths
}

// RootFromPath is RFC 9162 §2.1.3.2's verification without its final comparison: the root
// that path leads to from leaf at index in a tree of size (the signature is the comparison).
func RootFromPath(leaf []byte, index, size uint64, path []byte) ([]byte, error) {
	bad := func(what, where string) error { return prismerr.New("bad_signature", what, "").At(where) }
	if size == 0 || size > MaxTreeSize {
		return nil, bad("batch-scope tree_size "+u64(size)+" is outside 1.."+itoa(MaxTreeSize), "security.tree_size")
	}
	if index >= size {
		return nil, bad("batch-scope tree_index "+u64(index)+" is not below tree_size "+u64(size), "security.tree_index")
	}
	if len(path)%DigestBytes != 0 {
		return nil, bad("batch-scope tree_path is "+itoa(len(path))+" bytes, not a multiple of 32", "security.tree_path")
	}
	fn, sn, r := index, size-1, leaf
	for off := 0; off < len(path); off += DigestBytes {
		p := path[off : off+DigestBytes]
		if sn == 0 {
			return nil, bad("batch-scope tree_path is longer than the tree is deep", "security.tree_path")
		}
		if fn&1 == 1 || fn == sn {
			r = node(p, r)
			if fn&1 == 0 {
				for fn != 0 && fn&1 == 0 {
					fn >>= 1
					sn >>= 1
				}
			}
		} else {
			r = node(r, p)
		}
		fn >>= 1
		sn >>= 1
	}
	if sn != 0 {
		return nil, bad("batch-scope tree_path is shorter than the tree is deep", "security.tree_path")
	}
	return r, nil
}

func u64(v uint64) string { return strconv.FormatUint(v, 10) }

// BatchStatement is what a batch-scope signature signs: context, tree size (8 bytes big
// endian), root.
func BatchStatement(size uint64, root []byte) []byte {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], size)
	return concat(BatchContext, n[:], root)
}

// ---------------------------------------------------------------- batch verification cache

// cache keeps successful batch-scope verifications (all copies of a batch share one M and
// one signature, so a consumer pays one Ed25519 verify per batch). Keyed by everything
// verified; a hit counts only if the very key object that verified is still a candidate.
var cache = &lru{max: 1024, items: map[string]*list.Element{}, order: list.New()}

type lru struct {
	mu    sync.Mutex
	max   int
	items map[string]*list.Element
	order *list.List
}

type lruEntry struct {
	key string
	vk  *VerificationKey
}

func (c *lru) get(k string, candidates []*VerificationKey) *VerificationKey {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[k]
	if !ok {
		return nil
	}
	vk := el.Value.(*lruEntry).vk
	for _, cand := range candidates {
		if cand == vk {
			c.order.MoveToFront(el)
			return vk
		}
	}
	return nil
}

func (c *lru) put(k string, vk *VerificationKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[k]; ok {
		el.Value.(*lruEntry).vk = vk
		c.order.MoveToFront(el)
		return
	}
	c.items[k] = c.order.PushFront(&lruEntry{k, vk})
	for c.order.Len() > c.max {
		last := c.order.Back()
		c.order.Remove(last)
		delete(c.items, last.Value.(*lruEntry).key)
	}
}

// ClearVerificationCache forgets every cached batch-scope verification.
func ClearVerificationCache() {
	cache.mu.Lock()
	defer cache.mu.Unlock()
	cache.items = map[string]*list.Element{}
	cache.order.Init()
}
