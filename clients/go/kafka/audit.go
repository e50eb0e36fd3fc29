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
