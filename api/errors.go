package api

import (
	"encoding/json"
	"log/slog"
	"net/http"

	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/store"
)

// statusOf is the only code → HTTP status table (api/openapi.yaml, proto/PROTOCOL.md).
var statusOf = map[proto.Code]int{
	proto.CodeEmailAndPasswordRequired: http.StatusBadRequest,
	proto.CodePasswordTooShort:         http.StatusBadRequest,
	proto.CodeEmailNotAllowed:          http.StatusForbidden,
	proto.CodeEmailAlreadyRegistered:   http.StatusConflict,
	proto.CodeInvalidCredentials:       http.StatusUnauthorized,
	proto.CodeUnauthorized:             http.StatusUnauthorized,
	proto.CodeInvalidToken:             http.StatusUnauthorized,
	proto.CodeTokenExpired:             http.StatusUnauthorized,
	proto.CodeNameRequired:             http.StatusBadRequest,
	proto.CodeProjectNotFound:          http.StatusNotFound,
	proto.CodeKeyNotFound:              http.StatusNotFound,
	proto.CodeInvalidKeyType:           http.StatusBadRequest,
	proto.CodeMissingSecretKey:         http.StatusUnauthorized,
	proto.CodeInvalidSecretKey:         http.StatusUnauthorized,
	proto.CodeInvalidJSON:              http.StatusBadRequest,
	proto.CodeInvalidChannel:           http.StatusBadRequest,
	proto.CodePayloadTooLarge:          http.StatusRequestEntityTooLarge,
	proto.CodeChannelRateLimited:       http.StatusTooManyRequests,
	proto.CodeProjectRateLimited:       http.StatusTooManyRequests,
	proto.CodeJTIOrClientIDRequired:    http.StatusBadRequest,
	proto.CodeInvalidSince:             http.StatusBadRequest,
	proto.CodeInvalidQuery:             http.StatusBadRequest,
	proto.CodeInvalidBatch:             http.StatusBadRequest,

	proto.CodeNotFound:             http.StatusNotFound,
	proto.CodeMethodNotAllowed:     http.StatusMethodNotAllowed,
	proto.CodeUnsupportedMediaType: http.StatusUnsupportedMediaType,
	proto.CodeBodyTooLarge:         http.StatusRequestEntityTooLarge,
	proto.CodeInternal:             http.StatusInternalServerError,
	proto.CodeTooManyConnections:   http.StatusTooManyRequests,
	proto.CodeTooManyAttempts:      http.StatusTooManyRequests,
	proto.CodeUnavailable:          http.StatusServiceUnavailable,

	proto.CodeTooManyChannels:    http.StatusTooManyRequests,
	proto.CodeTooManyProjects:    http.StatusForbidden,
	proto.CodeTooManyRevocations: http.StatusTooManyRequests,

	proto.CodeInvalidOverlap: http.StatusBadRequest,

	proto.CodeAuthorizationRequired:  http.StatusBadRequest,
	proto.CodeInvalidJWKSURL:         http.StatusBadRequest,
	proto.CodeInvalidPrivateChannels: http.StatusBadRequest,
	proto.CodeWebhookQueueFull:       http.StatusTooManyRequests,

	proto.CodeSettingRequired:         http.StatusBadRequest,
	proto.CodeInvalidWebhookURL:       http.StatusBadRequest,
	proto.CodeWebhookURLRequired:      http.StatusBadRequest,
	proto.CodeInvalidChannelRateLimit: http.StatusBadRequest,
	proto.CodeInvalidHistoryRetention: http.StatusBadRequest,
}

// writeJSON writes v with status. Encoding our own response types cannot fail
// in a way the client could act on, so a failure is only logged.
func writeJSON(w http.ResponseWriter, status int, v any) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError writes the body {error: code} plus any extra fields, with the
// status of the table above.
func writeError(w http.ResponseWriter, code proto.Code, extra ...any) {
	body := map[string]any{"error": code}
	for i := 0; i+1 < len(extra); i += 2 {
		body[extra[i].(string)] = extra[i+1]
	}
	status, ok := statusOf[code]
	if !ok {
		status = http.StatusInternalServerError
	}
	writeJSON(w, status, body)
}

// writeInternal answers 500 for our own faults and logs the cause; the cause
// never reaches the body.
// A database that cannot be reached is a 503 service_unavailable instead.
func writeInternal(w http.ResponseWriter, log *slog.Logger, msg string, err error) {
	if store.IsUnavailable(err) {
		log.Warn(msg+": database unavailable", "err", err)
		writeError(w, proto.CodeUnavailable)
		return
	}
	log.Error(msg, "err", err)
	writeError(w, proto.CodeInternal)
}
