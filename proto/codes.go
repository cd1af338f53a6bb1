package proto

// Code is an error code (PROTOCOL.md › Errors on the socket, and the HTTP
// answers there and in api/openapi.yaml), spelled exactly as on the wire.
type Code string

const (
	CodeEmailAndPasswordRequired Code = "email_and_password_required"
	CodePasswordTooShort         Code = "password_too_short"
	CodeEmailNotAllowed          Code = "email_not_allowed"
	CodeEmailAlreadyRegistered   Code = "email_already_registered"
	CodeInvalidCredentials       Code = "invalid_credentials"
	CodeUnauthorized             Code = "unauthorized"
	CodeNameRequired             Code = "name_required"
	CodeProjectNotFound          Code = "project_not_found"
	CodeKeyNotFound              Code = "key_not_found"
	CodeInvalidKeyType           Code = "invalid_key_type"
	CodeMissingSecretKey         Code = "missing_secret_key"
	CodeInvalidSecretKey         Code = "invalid_secret_key"
	CodeInvalidJSON              Code = "invalid_json"
	CodeInvalidChannel           Code = "invalid_channel"
	CodePayloadTooLarge          Code = "payload_too_large"
	CodeChannelRateLimited       Code = "channel_rate_limited"
	CodeProjectRateLimited       Code = "project_rate_limited"
	CodeJTIOrClientIDRequired    Code = "jti_or_client_id_required"
	CodeUnknownAction            Code = "unknown_action"
	CodeClientIDRequired         Code = "client_id_required"
	CodeInvalidSince             Code = "invalid_since"
	CodeTokenAndTypeRequired     Code = "token_and_type_required"
	CodeClientEmitNotConfigured  Code = "client_emit_not_configured"
	CodeInvalidEmitToken         Code = "invalid_emit_token"
	CodeEmitIdentityMismatch     Code = "emit_identity_mismatch"
	CodeEmitTokenRevoked         Code = "emit_token_revoked"
	CodeClientEmitRateLimited    Code = "client_emit_rate_limited"

	// Codes beyond the product specification's: routing and transport
	// failures of the HTTP surface. They never replace a spec code.
	CodeNotFound             Code = "not_found"
	CodeMethodNotAllowed     Code = "method_not_allowed"
	CodeUnsupportedMediaType Code = "unsupported_media_type"
	CodeBodyTooLarge         Code = "body_too_large"
	CodeInternal             Code = "internal_error"
	CodeTooManySubscriptions Code = "too_many_subscriptions" // WebSocket: MAX_SUBSCRIPTIONS_PER_CONNECTION
	CodeTooManyConnections   Code = "too_many_connections"   // handshake 429: MAX_CONNECTIONS_PER_PROJECT or MAX_CONNECTIONS_PER_ADDRESS
	CodeTooManyAttempts      Code = "too_many_attempts"      // 429: login or signup throttled
	CodeUnavailable          Code = "service_unavailable"
	// Bounds on what one client or tenant can make the server hold (cmd/relay/OPERATING.md › Abuse limits).
	CodeClientIDTooLong        Code = "client_id_too_long"        // WebSocket: MAX_CLIENT_ID_BYTES
	CodeTooManyPresenceMembers Code = "too_many_presence_members" // WebSocket: MAX_PRESENCE_MEMBERS_PER_CHANNEL
	CodeTooManyChannels        Code = "too_many_channels"         // 429 / WebSocket: MAX_CHANNELS_PER_PROJECT
	CodeTooManyProjects        Code = "too_many_projects"         // 403: MAX_PROJECTS_PER_USER
	CodeTooManyRevocations     Code = "too_many_revocations"      // 429: MAX_REVOCATIONS_PER_PROJECT

	// Key rotation with an overlap window (api/README.md › Keys).
	CodeInvalidOverlap Code = "invalid_overlap" // 400: overlapSeconds not an integer from 0 to 86400

	// Server-side queries (PROTOCOL.md › Server-side queries and actions).
	CodeInvalidQuery Code = "invalid_query" // 400: a query parameter (named by param) out of range
	CodeInvalidBatch Code = "invalid_batch" // 400: POST /emit/batch with no messages or over 100

	// Channel authorization, on projects that turn it on (PROTOCOL.md › Channel authorization).
	CodeAuthorizationRequired  Code = "authorization_required"   // 400: PATCH …/authorization without a boolean
	CodeInvalidJWKSURL         Code = "invalid_jwks_url"         // 400: PATCH …/authorization with a jwksUrl that is not an http(s) URL
	CodeInvalidPrivateChannels Code = "invalid_private_channels" // 400: privateChannels not channel names or prefixes ending in *, or over 100

	// Webhook test events (POST /api/projects/{id}/webhook-test).
	CodeWebhookQueueFull      Code = "webhook_queue_full"      // 429: the project's (or every project's) webhook queue is full
	CodeInvalidToken          Code = "invalid_token"           // handshake 401, or a refresh refused
	CodeTokenExpired          Code = "token_expired"           // handshake 401
	CodeTokenRequired         Code = "token_required"          // WebSocket: presence without a connection token
	CodeClientIDMismatch      Code = "client_id_mismatch"      // WebSocket: presence clientId is not the token's sub
	CodeChannelForbidden      Code = "channel_forbidden"       // WebSocket: a private channel without a grant
	CodeInvalidSubscribeToken Code = "invalid_subscribe_token" // WebSocket: the subscribe's token is not valid

	// Project settings (PATCH …/settings, and the dashboard's forms).
	CodeSettingRequired         Code = "setting_required"           // 400: PATCH …/settings naming no setting
	CodeInvalidWebhookURL       Code = "invalid_webhook_url"        // 400: a webhook URL that is not an http(s) URL
	CodeWebhookURLRequired      Code = "webhook_url_required"       // 400: webhook events on a project without a webhook URL
	CodeInvalidChannelRateLimit Code = "invalid_channel_rate_limit" // 400: a channel budget override not a whole number from 1 to 1000000000
	CodeInvalidHistoryRetention Code = "invalid_history_retention"  // 400: historyRetentionSeconds not a whole number from 0 to HISTORY_MAX_RETENTION_SECONDS
)

// CloseTokenExpired closes a connection whose connection token expired
// without a refresh (channel authorization): reconnect with a fresh token.
const CloseTokenExpired = 4011

// CloseTokenRevoked closes a connection whose connection token was issued
// before its user's tokens were revoked (a disconnect with revokeTokens):
// the clients do not reconnect on their own.
const CloseTokenRevoked = 4012

// CloseProjectDeleted is the WebSocket close code a connection gets when its
// project is deleted (or found missing): reconnecting with the same key will
// not work.
const CloseProjectDeleted = 4004

// CloseClientDisconnected is the close code of the connections of a
// clientId that the project's backend disconnected (POST
// /clients/{clientId}/disconnect): reconnecting works unless the backend
// also stops the client from doing so.
const CloseClientDisconnected = 4003

// CloseKeyRevoked is the close code of the connections opened with a public
// key that was revoked or rotated: reconnecting with that key will not work.
const CloseKeyRevoked = 4001

// Error is a spec error as a value. Channel is set for the codes whose body
// carries the channel (invalid_channel, and WebSocket errors about a channel).
type Error struct {
	Code    Code
	Channel string
}

func (e *Error) Error() string {
	if e.Channel != "" {
		return string(e.Code) + " (" + e.Channel + ")"
	}
	return string(e.Code)
}
