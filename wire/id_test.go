package wire_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jazzmine/worker/wire"
)

func TestValidateID(t *testing.T) {
	tests := []struct {
		name    string
		id      string
		wantErr string // empty when the id is valid
	}{
		{name: "a plain name is valid", id: "default"},
		{name: "letters, digits, underscores and dashes are valid", id: "Exec_2024-01-a9"},
		{name: "a single character is valid", id: "x"},
		{name: "64 characters are valid", id: strings.Repeat("a", 64)},
		{name: "an empty id is missing", id: "", wantErr: `execution_id is missing`},
		{name: "65 characters are too long", id: strings.Repeat("a", 65), wantErr: `is too long: 65 characters, at most 64`},
		{name: "a dot is rejected so it cannot add a subject token", id: "a.b", wantErr: `execution_id "a.b" is invalid: only letters, digits, '_' and '-' are allowed, 1 to 64 characters`},
		{name: "a star wildcard is rejected", id: "*", wantErr: `is invalid`},
		{name: "a greater-than wildcard is rejected", id: "a>", wantErr: `is invalid`},
		{name: "a space is rejected", id: "a b", wantErr: `is invalid`},
		{name: "a non-ASCII letter is rejected", id: "café", wantErr: `is invalid`},
		{name: "a NUL byte is rejected", id: "a\x00", wantErr: `is invalid`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := wire.ValidateID("execution_id", tt.id)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("ValidateID(%q) = %v, want nil", tt.id, err)
				}
				return
			}
			if !errors.Is(err, wire.ErrInvalidID) {
				t.Fatalf("ValidateID(%q) = %v, want an error wrapping ErrInvalidID", tt.id, err)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ValidateID(%q) = %q, want it to contain %q", tt.id, err, tt.wantErr)
			}
		})
	}
}

func TestValidateIDQuotesALongValueShort(t *testing.T) {
	err := wire.ValidateID("sandbox", strings.Repeat("x", 1<<20))
	if err == nil {
		t.Fatal("ValidateID accepted a megabyte")
	}
	if len(err.Error()) > 300 {
		t.Errorf("the error message is %d bytes long, want it short: %.300s...", len(err.Error()), err)
	}
}
