package signing

import (
	"crypto/sha256"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/gen/draftpb"
	"github.com/prism-envelope/prism/clients/go/gen/reviewedpb"
	"github.com/prism-envelope/prism/clients/go/prismerr"
	"google.golang.org/protobuf/proto"
)

// begin records algorithm, key id and scope in env's security context and clears any old
// signature output: the state in which the signed message is computed.
func begin(env *envelope.Envelope, key *SigningKey, scope Scope) error {
	if key == nil || (key.Algorithm != HMACSHA256 && key.Algorithm != Ed25519) {
		return prismerr.New("algorithm_not_allowed", "signing key is missing or of an unsupported algorithm", "use NewHMACKey or NewEd25519Key")
	}
	switch scope {
	case ScopeLegacy, ScopeV2, ScopePair, ScopeBatch:
	default:
		return prismerr.Newf("unsupported_signature_scope", "signature scope %d is not one Prism signs with", uint64(scope)).
			WithHint("use ScopeV2, ScopePair or ScopeBatch")
	}
	sec := env.EnsureSecurity()
	sec.SignatureAlgorithm = proto.String(key.Algorithm)
	sec.SignatureKeyId = proto.String(key.KeyID)
	if scope == ScopeLegacy {
		sec.SignatureScope = nil // absent on the wire: what legacy producers emit
	} else {
		sec.SignatureScope = reviewedpb.SignatureScope(scope).Enum()
	}
	sec.Signature, sec.SiblingDigest, sec.TreeIndex, sec.TreeSize, sec.TreePath = nil, nil, nil, nil, nil
	return nil
}

// copyOf is one layout's serialized copy of a message, up to its security record.
type copyOf struct {
	lay     envelope.Layout
	header  proto.Message // *reviewedpb.PrismEnvelope or *draftpb.PrismEnvelope
	head    []byte
	sec     []byte
	payload []byte
}

func serialize(env *envelope.Envelope, lay envelope.Layout) (*copyOf, error) {
	h, err := envelope.LayoutHeader(env, lay)
	if err != nil {
		return nil, err
	}
	head, sec, err := envelope.SplitHeader(h, lay)
	if err != nil {
		return nil, err
	}
	return &copyOf{lay, h, head, sec, envelope.PayloadRecord(env, lay)}, nil
}

// cut is the copy's security record without the cut fields (re-framed).
func (c *copyOf) cut(fields map[int]bool) ([]byte, error) {
	data := concat(c.head, c.sec)
	p, err := parse(data, c.lay, true)
	if err != nil {
		return nil, err
	}
	return p.reframe(fields), nil
}

func (c *copyOf) digest(fields map[int]bool) ([]byte, error) {
	cut, err := c.cut(fields)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	h.Write(c.head)
	h.Write(cut)
	h.Write(c.payload)
	return h.Sum(nil), nil
}

// setOutputs writes the signer's outputs into the copy's security context and returns the
// copy's bytes: the head and payload unchanged, the security record serialized again.
func (c *copyOf) finish(sig, sibling []byte, index, size uint64, path []byte) ([]byte, error) {
	var sec proto.Message
	switch h := c.header.(type) {
	case *reviewedpb.PrismEnvelope:
		s := h.Security
		s.Signature = sig
		if sibling != nil {
			s.SiblingDigest = sibling
		}
		if size > 0 {
			s.TreeIndex, s.TreeSize = proto.Uint64(index), proto.Uint64(size)
			if len(path) > 0 {
				s.TreePath = path
			}
		}
		sec = s
	case *draftpb.PrismEnvelope:
		s := h.Security
		s.Signature, s.SiblingDigest, s.TreeIndex, s.TreeSize, s.TreePath = sig, sibling, index, size, path
		sec = s
	}
	rec, err := envelope.SecurityRecord(sec, c.lay)
	if err != nil {
		return nil, err
	}
	return concat(c.head, rec, c.payload), nil
}

// Sign signs the envelope with key in scope v2 (or ScopeLegacy, for feeding old verifiers)
// and returns its wire bytes in layout. It records algorithm, key id, scope and the
// signature in env's security context. For ScopePair or ScopeBatch, use SignPair or
// SignBatch, which write both layouts' copies.
func Sign(env *envelope.Envelope, key *SigningKey, layout envelope.Layout, scope Scope) ([]byte, error) {
	if layout == envelope.Auto {
		layout = envelope.Reviewed
	}
	if scope == ScopePair || scope == ScopeBatch {
		return nil, prismerr.New("unsupported_signature_scope", "the "+scope.String()+" scope signs both layouts of a message at once",
			"use SignPair or SignBatch").At("security.signature_scope")
	}
	if err := begin(env, key, scope); err != nil {
		return nil, err
	}
	c, err := serialize(env, layout)
	if err != nil {
		return nil, err
	}
	var m []byte
	if scope == ScopeV2 {
		cut, err := c.cut(cutV2)
		if err != nil {
			return nil, err
		}
		m = concat(v2Context(layout), c.head, cut, c.payload)
	} else {
		m = concat(c.head, c.payload)
	}
	sig := key.sign(m)
	out, err := c.finish(sig, nil, 0, 0, nil)
	env.Header.Security.Signature = sig
	return out, err
}

// SignPair signs both layouts' copies of one message with one pair-scope signature
// (docs/signing.md): the statement names both copies by their SHA-256 digests, and each
// copy carries the other's digest in sibling_digest, so a reader of either layout alone
// verifies it. Returns the draft copy and the reviewed copy.
func SignPair(env *envelope.Envelope, key *SigningKey) (draft, reviewed []byte, err error) {
	if err := begin(env, key, ScopePair); err != nil {
		return nil, nil, err
	}
	d, r, dd, rd, err := pairCopies(env, cutPair)
	if err != nil {
		return nil, nil, err
	}
	sig := key.sign(concat(PairContext, dd, rd))
	if draft, err = d.finish(sig, rd, 0, 0, nil); err != nil {
		return nil, nil, err
	}
	reviewed, err = r.finish(sig, dd, 0, 0, nil)
	return draft, reviewed, err
}

func pairCopies(env *envelope.Envelope, cut map[int]bool) (d, r *copyOf, dd, rd []byte, err error) {
	if d, err = serialize(env, envelope.Draft); err != nil {
		return
	}
	if r, err = serialize(env, envelope.Reviewed); err != nil {
		return
	}
	if dd, err = d.digest(cut); err != nil {
		return
	}
	rd, err = r.digest(cut)
	return
}

// SignBatch signs every envelope of a batch with ONE batch-scope signature over a Merkle
// tree of their pair digests (docs/signing.md, "Batch scope") and returns, per envelope,
// its draft and reviewed copies. Each copy carries the signature, its sibling's digest,
// its leaf index, the tree size and its audit path, and verifies on its own.
func SignBatch(envs []*envelope.Envelope, key *SigningKey) ([][2][]byte, error) {
	n := len(envs)
	if n == 0 {
		return nil, nil
	}
	if n > MaxTreeSize {
		return nil, prismerr.Newf("bad_signature", "a batch-scope signature covers at most %d messages, not %d", MaxTreeSize, n).WithHint("sign smaller batches")
	}
	type prepared struct {
		d, r   *copyOf
		dd, rd []byte
	}
	preps := make([]prepared, n)
	leaves := make([][]byte, n)
	for i, env := range envs {
		if err := begin(env, key, ScopeBatch); err != nil {
			return nil, err
		}
		d, r, dd, rd, err := pairCopies(env, cutBatch)
		if err != nil {
			return nil, err
		}
		preps[i] = prepared{d, r, dd, rd}
		leaves[i] = LeafHash(dd, rd)
	}
	root, paths := MerkleTree(leaves)
	sig := key.sign(BatchStatement(uint64(n), root))
	out := make([][2][]byte, n)
	for i, p := range preps {
		dOut, err := p.d.finish(sig, p.rd, uint64(i), uint64(n), paths[i])
		if err != nil {
			return nil, err
		}
		rOut, err := p.r.finish(sig, p.dd, uint64(i), uint64(n), paths[i])
		if err != nil {
			return nil, err
		}
		out[i] = [2][]byte{dOut, rOut}
	}
	return out, nil
}
