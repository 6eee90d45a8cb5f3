package wire

// MaxIDLength is the longest sandbox name or execution id, in bytes.
const MaxIDLength = 64

// ValidateID reports whether s is a valid sandbox name or execution id:
// 1 to [MaxIDLength] ASCII letters, digits, '_' or '-', the pattern
// ^[A-Za-z0-9_-]{1,64}$ of the NATS contract. Such a string is safe as a
// single subject token and as part of a consumer name. kind names what s is
// ("execution_id", "sandbox") in the error message. The error wraps
// [ErrInvalidID].
func ValidateID(kind, s string) error {
	switch {
	case s == "":
		return errorf(ErrInvalidID, "%s is missing: it must be 1 to %d letters, digits, '_' or '-'", kind, MaxIDLength)
	case len(s) > MaxIDLength:
		return errorf(ErrInvalidID, "%s %s is too long: %d characters, at most %d are allowed", kind, quote(s), len(s), MaxIDLength)
	}
	for i := 0; i < len(s); i++ {
		if !isIDByte(s[i]) {
			return errorf(ErrInvalidID, "%s %s is invalid: only letters, digits, '_' and '-' are allowed, 1 to %d characters", kind, quote(s), MaxIDLength)
		}
	}
	return nil
}

func isIDByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-'
}

// validSecretName reports whether s looks like an environment variable name:
// ^[A-Za-z_][A-Za-z0-9_]*$.
func validSecretName(s string) bool {
	if s == "" || '0' <= s[0] && s[0] <= '9' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '-' || !isIDByte(c) {
			return false
		}
	}
	return true
}
