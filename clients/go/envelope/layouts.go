package envelope

import (
	"strconv"
	"strings"

	"github.com/prism-envelope/prism/clients/go/gen/draftpb"
	"github.com/prism-envelope/prism/clients/go/gen/reviewedpb"
	"github.com/prism-envelope/prism/clients/go/prismerr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// The conversion between the draft and the reviewed layout, the same mapping as Python's
// app/envelope/layouts.py (lossless for every field both layouts have; what the other side
// cannot hold is reported, never silently lost):
//
//   - draft -> reviewed: sub-millisecond precision of published_at;
//   - reviewed -> draft: explicit presence of zero values, which proto3 plain fields cannot
//     tell from unset.
//
// The revision-2 encryption fields the draft lacks travel in draft extensions under
// prism.enc.*, and unknown fields of a newer producer travel as their exact wire records in
// prism.unknown.<layout>[.<path>] and are put back on their numbers when the envelope
// returns to the layout they came from.

// KnownEnvelopeVersion is the draft envelope_version this client writes and fully understands.
const KnownEnvelopeVersion = 1

// Extension keys used by the conversion (shared with the Python SDK and the worker).
const (
	ProducerVersionExt = "prism.producer_envelope_version"
	UnknownExtPrefix   = "prism.unknown."
	EncExtPrefix       = "prism.enc."
	encTypeKey         = EncExtPrefix + "encryption_type"
	encPubKey          = EncExtPrefix + "public_key_id"
	encEncapKey        = EncExtPrefix + "encapsulated_key"
	encParamsKey       = EncExtPrefix + "algorithm_params"
	draftUnknown       = UnknownExtPrefix + "draft"
	reviewedUnknown    = UnknownExtPrefix + "reviewed"
)

var carriedPaths = []string{"", ".metadata", ".security", ".security.encryption"}

// sub returns the nested message at path (".security.encryption"), or nil when unset.
func sub(m protoreflect.Message, path string) protoreflect.Message {
	if path == "" {
		return m
	}
	for _, name := range strings.Split(path[1:], ".") {
		fd := m.Descriptor().Fields().ByName(protoreflect.Name(name))
		if !m.Has(fd) {
			return nil
		}
		m = m.Get(fd).Message()
	}
	return m
}

func subMutable(m protoreflect.Message, path string) protoreflect.Message {
	if path == "" {
		return m
	}
	for _, name := range strings.Split(path[1:], ".") {
		m = m.Mutable(m.Descriptor().Fields().ByName(protoreflect.Name(name))).Message()
	}
	return m
}

// carryUnknown puts src's unknown fields into ext under prefix+path: their numbers mean
// something else in the other layout, so they cannot be written there on their own numbers.
// Unknown fields the record walker cannot read (a group) cannot be carried: they are refused
// with the walker's error, as Python's conversion refuses them (UnknownRecords would carry
// them whole, so a draft header Python refuses decoded in Go).
func carryUnknown(src protoreflect.Message, prefix string, ext map[string][]byte) error {
	for _, path := range carriedPaths {
		if m := sub(src, path); m != nil {
			if raw := m.GetUnknown(); len(raw) > 0 {
				if _, err := Scan(raw); err != nil {
					return err
				}
			}
			if raw := UnknownRecords(m); len(raw) > 0 {
				ext[prefix+path] = append([]byte(nil), raw...)
			}
		}
	}
	return nil
}

// restoreUnknown puts fields carried by carryUnknown back on their own numbers in dst (the
// layout they came from) and removes their extensions. Only records whose numbers dst does
// not know are merged, so an extension can never set a known field; a malformed value stays
// where it is, an extension like any other.
func restoreUnknown(dst protoreflect.Message, prefix string, ext map[string][]byte) {
	for _, path := range carriedPaths {
		key := prefix + path
		raw, ok := ext[key]
		if !ok {
			continue
		}
		recs, err := Scan(raw)
		if err != nil {
			continue
		}
		m := subMutable(dst, path)
		fields := m.Descriptor().Fields()
		keep := append([]byte(nil), m.GetUnknown()...)
		for _, r := range recs {
			if fields.ByNumber(protoreflect.FieldNumber(r.Field)) == nil {
				keep = append(keep, raw[r.Start:r.End]...)
			}
		}
		m.SetUnknown(keep)
		delete(ext, key)
	}
}

// zeroPresence reports optional scalars explicitly set to their zero value.
func zeroPresence(m protoreflect.Message, path string, dropped *[]string) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Message() != nil {
			if !fd.IsList() && !fd.IsMap() {
				zeroPresence(v.Message(), path+"."+string(fd.Name()), dropped)
			}
			return true
		}
		if fd.HasPresence() && !fd.IsList() && v.Equal(fd.Default()) && fd.Name() != "content_encoding" {
			*dropped = append(*dropped, path+"."+string(fd.Name())+": explicit zero value is indistinguishable from unset in the draft layout")
		}
		return true
	})
}

// DraftToReviewed maps a draft header (its payload is handled by the codec) to the reviewed
// model; the second result lists what the reviewed layout cannot hold.
func DraftToReviewed(d *draftpb.PrismEnvelope) (*reviewedpb.PrismEnvelope, []string, error) {
	if err := refuseOddMapEntries(d.ProtoReflect(), "draft", 99); err != nil {
		return nil, nil, err
	}
	var dropped []string
	v := &reviewedpb.PrismEnvelope{}
	if dm := d.Metadata; dm != nil {
		vm := &reviewedpb.PrismMetadata{MessageId: dm.MessageId, Topic: dm.Topic, Namespace: dm.Namespace}
		if ts := dm.PublishedAt; ts != nil {
			nanos := int64(ts.Nanos)
			q := nanos / 1_000_000
			if nanos%1_000_000 != 0 && nanos < 0 {
				q-- // floor division, as Python's //
			}
			vm.PublishedAtMs = ts.Seconds*1000 + q
			if r := nanos - q*1_000_000; r != 0 {
				dropped = append(dropped, "metadata.published_at: sub-millisecond part ("+strconv.FormatInt(r, 10)+" ns)")
			}
		}
		if dm.ContentType != "" {
			SetContentType(vm, dm.ContentType)
		}
		if dm.ContentEncoding != "" {
			SetContentEncoding(vm, dm.ContentEncoding)
		}
		if dm.Priority != 0 {
			vm.Priority = proto.Int32(dm.Priority)
		}
		if dm.TtlSeconds != 0 {
			vm.TtlSeconds = proto.Int64(dm.TtlSeconds)
		}
		if dm.CorrelationId != "" {
			vm.CorrelationId = proto.String(dm.CorrelationId)
		}
		if dm.CausalityParent != "" {
			vm.CausalityParent = proto.String(dm.CausalityParent)
		}
		if dm.ProducerSdkVersion != "" {
			vm.ProducerSdkVersion = proto.String(dm.ProducerSdkVersion)
		}
		v.Metadata = vm
	}
	ext := make(map[string][]byte, len(d.Extensions))
	for k, val := range d.Extensions {
		ext[k] = val
	}
	if ds := d.Security; ds != nil {
		vs := &reviewedpb.SecurityContext{}
		optStr := func(s string) *string {
			if s == "" {
				return nil
			}
			return proto.String(s)
		}
		vs.PublisherId, vs.PublisherTeam, vs.AuthToken = optStr(ds.PublisherId), optStr(ds.PublisherTeam), optStr(ds.AuthToken)
		vs.SignatureAlgorithm, vs.DataClassification, vs.SignatureKeyId = optStr(ds.SignatureAlgorithm), optStr(ds.DataClassification), optStr(ds.SignatureKeyId)
		if len(ds.Signature) > 0 {
			vs.Signature = ds.Signature
		}
		if ds.ContainsPii {
			vs.ContainsPii = proto.Bool(true)
		}
		if ds.SignatureScope != 0 {
			vs.SignatureScope = reviewedpb.SignatureScope(ds.SignatureScope).Enum()
		}
		if len(ds.SiblingDigest) > 0 {
			vs.SiblingDigest = ds.SiblingDigest
		}
		if ds.TreeSize != 0 {
			vs.TreeIndex, vs.TreeSize = proto.Uint64(ds.TreeIndex), proto.Uint64(ds.TreeSize)
			if len(ds.TreePath) > 0 {
				vs.TreePath = ds.TreePath
			}
		}
		if de := ds.Encryption; de != nil {
			ve := &reviewedpb.EncryptionMetadata{KeyId: de.KeyId, Algorithm: de.Algorithm}
			if len(de.Iv) > 0 {
				ve.Iv = de.Iv
			}
			if len(de.Aad) > 0 {
				ve.Aad = de.Aad
			}
			if raw, ok := ext[encTypeKey]; ok {
				t, ok := encTypeValue(string(raw))
				if !ok {
					return nil, nil, prismerr.New("malformed_envelope", "envelope header is inconsistent: unknown encryption type "+quote(string(raw)),
						"").At("extensions[" + encTypeKey + "]")
				}
				ve.EncryptionType = reviewedpb.EncryptionType(t)
			}
			if raw, ok := ext[encPubKey]; ok {
				ve.PublicKeyId = proto.String(string(raw))
			}
			if raw, ok := ext[encEncapKey]; ok {
				ve.EncapsulatedKey = raw
			}
			if raw, ok := ext[encParamsKey]; ok {
				ve.AlgorithmParams = proto.String(string(raw))
			}
			vs.Encryption = ve
		}
		v.Security = vs
	}
	for _, k := range []string{encTypeKey, encPubKey, encEncapKey, encParamsKey} {
		delete(ext, k)
	}
	if err := carryUnknown(d.ProtoReflect(), draftUnknown, ext); err != nil {
		return nil, nil, err
	}
	for k := range ext {
		if strings.HasPrefix(k, reviewedUnknown) {
			restoreUnknown(v.ProtoReflect(), reviewedUnknown, ext)
			break
		}
	}
	if d.EnvelopeVersion > KnownEnvelopeVersion {
		ext[ProducerVersionExt] = []byte(strconv.Itoa(int(d.EnvelopeVersion)))
		dropped = append(dropped, "envelope_version: "+strconv.Itoa(int(d.EnvelopeVersion))+" is newer than 1; read on a best-effort basis (kept in extensions['"+ProducerVersionExt+"'])")
	} else if d.EnvelopeVersion < 0 {
		dropped = append(dropped, "envelope_version: "+strconv.Itoa(int(d.EnvelopeVersion))+" is not a version (read as 1)")
	}
	if len(ext) > 0 {
		v.Extensions = ext
	}
	if d.Observability != nil {
		v.Observability = &reviewedpb.ObservabilityContext{}
		if err := rewire(d.Observability, v.Observability); err != nil {
			return nil, nil, err
		}
	}
	if d.Schema != nil {
		v.Schema = &reviewedpb.SchemaContext{}
		if err := rewire(d.Schema, v.Schema); err != nil {
			return nil, nil, err
		}
	}
	return v, dropped, nil
}

// rewire copies a message into its twin of the other layout through its wire bytes (the
// observability and schema contexts have the same numbering in both), unknown fields included.
func rewire(src, dst proto.Message) error {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(src)
	if err == nil {
		if err = proto.Unmarshal(b, dst); err == nil {
			upbMapEntries(dst.ProtoReflect(), b, 0) // odd map entries stay unknown fields
		}
	}
	if err != nil {
		return (&prismerr.Error{Code: "malformed_envelope", What: "context cannot be converted: " + err.Error()}).Wrap(err)
	}
	return nil
}

// ReviewedToDraft maps the reviewed model's header to a draft header (envelope_version 1);
// the second result lists what the draft layout cannot hold.
func ReviewedToDraft(v *reviewedpb.PrismEnvelope) (*draftpb.PrismEnvelope, []string, error) {
	if err := refuseOddMapEntries(v.ProtoReflect(), "reviewed", 97); err != nil {
		return nil, nil, err
	}
	var dropped []string
	d := &draftpb.PrismEnvelope{EnvelopeVersion: KnownEnvelopeVersion}
	if v.Metadata != nil {
		zeroPresence(v.Metadata.ProtoReflect(), "metadata", &dropped)
		d.Metadata = DraftMetadata(v.Metadata)
	}
	if v.Security != nil {
		zeroPresence(v.Security.ProtoReflect(), "security", &dropped)
	}
	ext := make(map[string][]byte, len(v.Extensions))
	for k, val := range v.Extensions {
		ext[k] = val
	}
	if vs := v.Security; vs != nil {
		ds := &draftpb.SecurityContext{
			PublisherId: vs.GetPublisherId(), PublisherTeam: vs.GetPublisherTeam(), AuthToken: vs.GetAuthToken(),
			Signature: vs.Signature, SignatureAlgorithm: vs.GetSignatureAlgorithm(), ContainsPii: vs.GetContainsPii(),
			DataClassification: vs.GetDataClassification(), SignatureKeyId: vs.GetSignatureKeyId(),
			SignatureScope: draftpb.SignatureScope(vs.GetSignatureScope()), SiblingDigest: vs.SiblingDigest,
			TreeIndex: vs.GetTreeIndex(), TreeSize: vs.GetTreeSize(), TreePath: vs.TreePath,
		}
		if ve := vs.Encryption; ve != nil {
			ds.Encryption = &draftpb.EncryptionMetadata{KeyId: ve.KeyId, Algorithm: ve.Algorithm, Iv: ve.Iv, Aad: ve.Aad}
			if ve.EncryptionType != 0 {
				ext[encTypeKey] = []byte(encTypeName(ve.EncryptionType))
			}
			if ve.PublicKeyId != nil {
				ext[encPubKey] = []byte(*ve.PublicKeyId)
			}
			if ve.EncapsulatedKey != nil {
				ext[encEncapKey] = ve.EncapsulatedKey
			}
			if ve.AlgorithmParams != nil {
				ext[encParamsKey] = []byte(*ve.AlgorithmParams)
			}
		}
		d.Security = ds
	}
	if err := carryUnknown(v.ProtoReflect(), reviewedUnknown, ext); err != nil {
		return nil, nil, err
	}
	for k := range ext {
		if strings.HasPrefix(k, draftUnknown) {
			restoreUnknown(d.ProtoReflect(), draftUnknown, ext)
			break
		}
	}
	if len(ext) > 0 {
		d.Extensions = ext
	}
	if v.Observability != nil {
		d.Observability = &draftpb.ObservabilityContext{}
		if err := rewire(v.Observability, d.Observability); err != nil {
			return nil, nil, err
		}
	}
	if v.Schema != nil {
		d.Schema = &draftpb.SchemaContext{}
		if err := rewire(v.Schema, d.Schema); err != nil {
			return nil, nil, err
		}
	}
	return d, dropped, nil
}

// encTypeName is prism.enc.encryption_type for an EncryptionType: its name, or the bare
// number when this build does not know it (proto3 keeps unknown enum numbers).
func encTypeName(t reviewedpb.EncryptionType) string {
	if name, ok := reviewedpb.EncryptionType_name[int32(t)]; ok {
		return name
	}
	return strconv.Itoa(int(t))
}

// encTypeValue is the inverse of encTypeName: a name, or a decimal number (ASCII digits
// only, within int32); anything else is not an encryption type.
func encTypeValue(text string) (reviewedpb.EncryptionType, bool) {
	if text != "" && strings.Trim(text, "0123456789") == "" {
		n, err := strconv.ParseInt(text, 10, 32)
		return reviewedpb.EncryptionType(n), err == nil
	}
	v, ok := reviewedpb.EncryptionType_value[text]
	return reviewedpb.EncryptionType(v), ok
}

// DraftMetadata is the draft metadata for reviewed metadata.
func DraftMetadata(vm *reviewedpb.PrismMetadata) *draftpb.PrismMetadata {
	ms := vm.PublishedAtMs
	sec, rem := ms/1000, ms%1000
	if rem < 0 {
		sec, rem = sec-1, rem+1000
	}
	return &draftpb.PrismMetadata{
		MessageId: vm.MessageId, Topic: vm.Topic, Namespace: vm.Namespace,
		PublishedAt:     &timestamppb.Timestamp{Seconds: sec, Nanos: int32(rem) * 1_000_000},
		ContentType:     ContentType(vm),
		ContentEncoding: ContentEncoding(vm),
		Priority:        vm.GetPriority(), TtlSeconds: vm.GetTtlSeconds(), CorrelationId: vm.GetCorrelationId(),
		CausalityParent: vm.GetCausalityParent(), ProducerSdkVersion: vm.GetProducerSdkVersion(),
	}
}
