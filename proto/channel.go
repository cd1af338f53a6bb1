package proto

// ValidChannel reports whether name is 1 to 200 characters of [a-zA-Z0-9_\-.:]
// (PROTOCOL.md › subscribe).
func ValidChannel(name string) bool {
	if len(name) == 0 || len(name) > MaxChannelLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '_', c == '-', c == '.', c == ':':
		default:
			return false
		}
	}
	return true
}
