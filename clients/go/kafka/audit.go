package kafka

import (
	"regexp"
	"time"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/prismerr"
)

// Classification levels, lowest first (docs/sdk.md, "Classification and audit").
var levels = []string{"public", "internal", "confidential", "restricted"}

func rank(level string) int {
	for i, l := range levels {
		if l == level {
			return i
		}
	}
	return -1
}

// Defaults of a subscription's clearance, as in the Python SDK (app/sdk/audit.py).
const (
	DefaultClearance  = "internal"
	UnclassifiedAs    = "internal"
	DefaultAuditTopic = "prism.audit"
	AuditEvent        = "classified_delivery"
)

var (
	principalRE = regexp.MustCompile(`^[!-~]{1,256}$`)
	topicRE     = regexp.MustCompile(`^[A-Za-z0-9._-]{1,200}$`)
)

// ClassificationOf is what a subscriber is judged against: the envelope's own field (never a
// header). Empty reads as internal, an unknown word as restricted (fail closed).
func ClassificationOf(env *envelope.Envelope) string {
	v := env.Header.GetSecurity().GetDataClassification()
	if v == "" {
		return UnclassifiedAs
	}
	if rank(v) < 0 {
		return "restricted"
	}
	return v
}

func audited(classification string) bool {
	return classification == "confidential" || classification == "restricted"
}

// clearance validates a subscription's clearance settings, every problem at once.
func clearance(level, principal, auditTopic, topic string) (string, string, error) {
	if level == "" {
		level = DefaultClearance
	}
	if auditTopic == "" {
		auditTopic = DefaultAuditTopic
	}
	var problems []string
	if rank(level) < 0 {
		problems = append(problems, "clearance "+quote(level)+" is not one of public, internal, confidential, restricted")
	} else if audited(level) && principal == "" {
		problems = append(problems, "clearance "+quote(level)+" receives audited data and needs a Principal (who reads it, e.g. the service account 'svc-billing'), which every audit record names")
	}
	if principal != "" && !principalRE.MatchString(principal) {
		problems = append(problems, "principal must be 1-256 printable characters without spaces")
	}
	if !topicRE.MatchString(auditTopic) {
		problems = append(problems, "audit topic "+quote(clip(auditTopic))+" is not a topic name (letters, digits, '.', '_', '-')")
	} else if auditTopic == topic {
		problems = append(problems, "the audit topic is the subscribed topic itself; audit records go to their own topic")
	}
	if len(problems) > 0 {
		what := "invalid subscription clearance: " + problems[0]
		for _, p := range problems[1:] {
			what += "; " + p
		}
		return "", "", prismerr.New("bad_config", what, `e.g. SubscribeConfig{Clearance: "confidential", Principal: "svc-billing"} - docs/sdk-go.md`).At("SubscribeConfig.Clearance")
	}
	return level, auditTopic, nil
}

// AuditRecord is the audit record of one classified delivery: who, what (by id), where,
// when. Never the payload, never a token. The same fields as the Python SDK's.
type AuditRecord struct {
	Event          string `json:"event"`
	Principal      string `json:"principal"`
	Group          string `json:"group"`
	MessageID      string `json:"message_id"`
	Namespace      string `json:"namespace"`
	Topic          string `json:"topic"`
	Classification string `json:"classification"`
	Time           string `json:"time"`
	TimeMs         int64  `json:"time_ms"`
	Backend        string `json:"backend"`
	Ref            string `json:"ref"`
}

func newAuditRecord(env *envelope.Envelope, classification, principal, group, ref string, now time.Time) AuditRecord {
	md := env.Header.GetMetadata()
	return AuditRecord{Event: AuditEvent, Principal: principal, Group: group, MessageID: md.GetMessageId(),
		Namespace: md.GetNamespace(), Topic: md.GetTopic(), Classification: classification,
		Time: now.UTC().Format("2006-01-02T15:04:05.000Z"), TimeMs: now.UnixMilli(), Backend: "kafka", Ref: ref}
}

// Refused reads (docs/sdk.md, "Classification and audit"; app/sdk/audit.py): a message withheld
// from a subscription below its classification writes a classified_refused record, in the
// Python SDK's format. The refusals met between two messages handed out (or while working
// through one fetch) share one record, at most RefusalsPerRecord messages and about
// RefusalRecordBytes, so a flood of messages labelled above a subscriber's clearance costs the
// audit topic ~60 bytes per message, not a signed record each.
const (
	RefusalEvent       = "classified_refused"
	RefusalsPerRecord  = 256
	RefusalRecordBytes = 48 * 1024
)

// refusalEntry is one refused message inside a record of several.
type refusalEntry struct {
	MessageID, Namespace, Classification, Ref string
}

// bytes is at most what the entry adds to a record's JSON (quotes and separators included).
func (e refusalEntry) bytes() int {
	return len(e.MessageID) + len(e.Namespace) + len(e.Classification) + len(e.Ref) + 12
}

// RefusalRecord is the audit record of one or more refused reads: the fields of a delivery's
// record (those of the first refused message; Classification the highest refused) plus the
// subscription's clearance, and for several messages Count and Messages - each
// [message_id, classification, ref] with a fourth item, the namespace, where it is not the
// record's. Principal is null when the subscription names none. Never payload, never a token.
type RefusalRecord struct {
	Event          string     `json:"event"`
	Principal      *string    `json:"principal"`
	Group          string     `json:"group"`
	MessageID      string     `json:"message_id"`
	Namespace      string     `json:"namespace"`
	Topic          string     `json:"topic"`
	Classification string     `json:"classification"`
	Time           string     `json:"time"`
	TimeMs         int64      `json:"time_ms"`
	Backend        string     `json:"backend"`
	Ref            string     `json:"ref"`
	Clearance      string     `json:"clearance"`
	Count          int        `json:"count,omitempty"`
	Messages       [][]string `json:"messages,omitempty"`
}

func newRefusalRecord(first *envelope.Envelope, entries []refusalEntry, clearance, principal, group string, now time.Time) RefusalRecord {
	top := entries[0].Classification
	for _, e := range entries[1:] {
		if rank(e.Classification) > rank(top) {
			top = e.Classification
		}
	}
	base := newAuditRecord(first, top, principal, group, entries[0].Ref, now)
	r := RefusalRecord{Event: RefusalEvent, Group: base.Group, MessageID: base.MessageID, Namespace: base.Namespace,
		Topic: base.Topic, Classification: top, Time: base.Time, TimeMs: base.TimeMs, Backend: base.Backend,
		Ref: base.Ref, Clearance: clearance}
	if principal != "" {
		r.Principal = &principal
	}
	if len(entries) > 1 {
		r.Count = len(entries)
		for _, e := range entries {
			m := []string{e.MessageID, e.Classification, e.Ref}
			if e.Namespace != r.Namespace {
				m = append(m, e.Namespace)
			}
			r.Messages = append(r.Messages, m)
		}
	}
	return r
}
