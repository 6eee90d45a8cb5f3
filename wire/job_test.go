package wire_test

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/jazzmine/worker/wire"
)

// validJob returns a job that passes Validate("default", 0).
func validJob() *wire.Job {
	return &wire.Job{
		ExecutionID: "exec-1",
		Script:      "emit_result(1)",
	}
}

func TestJobValidate(t *testing.T) {
	manyKeys := map[string]string{}
	for i := range wire.MaxMetadataKeys + 1 {
		manyKeys[fmt.Sprint("k", i)] = "v"
	}
	manySecrets := make([]string, wire.MaxRequiredSecrets+1)
	for i := range manySecrets {
		manySecrets[i] = fmt.Sprint("S", i)
	}

	tests := []struct {
		name    string
		edit    func(j *wire.Job)
		subject string // the subject's sandbox; "default" unless set
		max     int
		wantIs  []error // nil when the job is valid
		wantMsg string
	}{
		{name: "a minimal job is valid", edit: func(j *wire.Job) {}},
		{name: "a job with every field set is valid", edit: func(j *wire.Job) {
			j.Sandbox = "default"
			j.Mode = wire.ModeInteractive
			j.TimeoutSec = 12.5
			j.MaxOutputBytes = 1 << 20
			j.RequiredSecrets = []string{"API_KEY", "_private", "x1"}
			j.Metadata = map[string]string{"agent": "planner", "step": "3"}
		}},
		{name: "the largest timeout is valid", edit: func(j *wire.Job) { j.TimeoutSec = wire.MaxTimeoutSec }},
		{name: "a script exactly at the limit is valid", max: 14, edit: func(j *wire.Job) {}},
		{name: "metadata of exactly the byte limit is valid", edit: func(j *wire.Job) {
			j.Metadata = map[string]string{"k": strings.Repeat("v", wire.MaxMetadataBytes-1)}
		}},

		{name: "a missing execution id is rejected", edit: func(j *wire.Job) { j.ExecutionID = "" },
			wantIs: []error{wire.ErrInvalidJob, wire.ErrInvalidID}, wantMsg: "invalid job: execution_id is missing"},
		{name: "an execution id with a dot is rejected", edit: func(j *wire.Job) { j.ExecutionID = "a.b" },
			wantIs:  []error{wire.ErrInvalidJob, wire.ErrInvalidID},
			wantMsg: `invalid job: execution_id "a.b" is invalid: only letters, digits, '_' and '-' are allowed, 1 to 64 characters`},
		{name: "a sandbox that differs from the subject's is rejected", edit: func(j *wire.Job) { j.Sandbox = "other" },
			wantIs: []error{wire.ErrInvalidJob}, wantMsg: `sandbox "other" in the job does not match the sandbox "default" of the subject`},
		{name: "no sandbox in the body or the subject is rejected", subject: "-", edit: func(j *wire.Job) {},
			wantIs: []error{wire.ErrInvalidJob, wire.ErrInvalidID}, wantMsg: "sandbox is missing"},
		{name: "an invalid sandbox in the body is rejected without a subject", subject: "-", edit: func(j *wire.Job) { j.Sandbox = "a b" },
			wantIs: []error{wire.ErrInvalidJob, wire.ErrInvalidID}, wantMsg: `sandbox "a b" is invalid`},
		{name: "a missing script is rejected", edit: func(j *wire.Job) { j.Script = "" },
			wantIs: []error{wire.ErrInvalidJob}, wantMsg: "script is missing"},
		{name: "a script over the default limit is rejected", edit: func(j *wire.Job) { j.Script = strings.Repeat("#", wire.DefaultMaxScriptBytes+1) },
			wantIs: []error{wire.ErrInvalidJob, wire.ErrScriptTooLarge}, wantMsg: "script is 262145 bytes, more than the limit of 262144 bytes"},
		{name: "a script over a given limit is rejected", max: 10, edit: func(j *wire.Job) {},
			wantIs: []error{wire.ErrInvalidJob, wire.ErrScriptTooLarge}, wantMsg: "more than the limit of 10 bytes"},
		{name: "a script that is not UTF-8 is rejected", edit: func(j *wire.Job) { j.Script = "print('\xff')" },
			wantIs: []error{wire.ErrInvalidJob}, wantMsg: "script is not valid UTF-8"},
		{name: "an unknown mode is rejected", edit: func(j *wire.Job) { j.Mode = "Plan" },
			wantIs: []error{wire.ErrInvalidJob}, wantMsg: `mode "Plan" is invalid: it must be "plan" (the default) or "interactive"`},
		{name: "a negative timeout is rejected", edit: func(j *wire.Job) { j.TimeoutSec = -1 },
			wantIs: []error{wire.ErrInvalidJob}, wantMsg: "timeout_sec -1 is invalid: it must be between 0 (the worker's default) and 3600 seconds"},
		{name: "a timeout over an hour is rejected", edit: func(j *wire.Job) { j.TimeoutSec = 3600.5 },
			wantIs: []error{wire.ErrInvalidJob}, wantMsg: "timeout_sec 3600.5 is invalid"},
		{name: "a NaN timeout is rejected", edit: func(j *wire.Job) { j.TimeoutSec = math.NaN() },
			wantIs: []error{wire.ErrInvalidJob}, wantMsg: "timeout_sec NaN is invalid"},
		{name: "an infinite timeout is rejected", edit: func(j *wire.Job) { j.TimeoutSec = math.Inf(1) },
			wantIs: []error{wire.ErrInvalidJob}, wantMsg: "timeout_sec +Inf is invalid"},
		{name: "a negative max_output_bytes is rejected", edit: func(j *wire.Job) { j.MaxOutputBytes = -1 },
			wantIs: []error{wire.ErrInvalidJob}, wantMsg: "max_output_bytes -1 is invalid"},
		{name: "a max_output_bytes over the limit is rejected", edit: func(j *wire.Job) { j.MaxOutputBytes = 1 << 30 },
			wantIs: []error{wire.ErrInvalidJob}, wantMsg: "max_output_bytes 1073741824 is invalid: it must be between 0 (the worker's default) and 16777216"},
		{name: "a max_output_bytes at the limit is taken", edit: func(j *wire.Job) { j.MaxOutputBytes = wire.MaxOutputLimit }},
		{name: "a secret name starting with a digit is rejected", edit: func(j *wire.Job) { j.RequiredSecrets = []string{"OK", "1KEY"} },
			wantIs: []error{wire.ErrInvalidJob}, wantMsg: `required_secrets[1] "1KEY" is invalid`},
		{name: "a secret name with a dash is rejected", edit: func(j *wire.Job) { j.RequiredSecrets = []string{"API-KEY"} },
			wantIs: []error{wire.ErrInvalidJob}, wantMsg: `required_secrets[0] "API-KEY" is invalid`},
		{name: "an empty secret name is rejected", edit: func(j *wire.Job) { j.RequiredSecrets = []string{""} },
			wantIs: []error{wire.ErrInvalidJob}, wantMsg: `required_secrets[0] "" is invalid`},
		{name: "a very long secret name is rejected", edit: func(j *wire.Job) { j.RequiredSecrets = []string{strings.Repeat("A", 129)} },
			wantIs: []error{wire.ErrInvalidJob}, wantMsg: "is too long"},
		{name: "too many secrets are rejected", edit: func(j *wire.Job) { j.RequiredSecrets = manySecrets },
			wantIs: []error{wire.ErrInvalidJob}, wantMsg: "required_secrets holds 65 names, at most 64 are allowed"},
		{name: "too many metadata keys are rejected", edit: func(j *wire.Job) { j.Metadata = manyKeys },
			wantIs: []error{wire.ErrInvalidJob}, wantMsg: "metadata holds 65 keys, at most 64 are allowed"},
		{name: "metadata over the byte limit is rejected", edit: func(j *wire.Job) {
			j.Metadata = map[string]string{"k": strings.Repeat("v", wire.MaxMetadataBytes)}
		}, wantIs: []error{wire.ErrInvalidJob}, wantMsg: "metadata is 4097 bytes (keys and values added up), at most 4096 are allowed"},
		{name: "an empty metadata key is rejected", edit: func(j *wire.Job) { j.Metadata = map[string]string{"": "v"} },
			wantIs: []error{wire.ErrInvalidJob}, wantMsg: "metadata has an empty key"},
		{name: "a metadata value that is not UTF-8 is rejected", edit: func(j *wire.Job) { j.Metadata = map[string]string{"k": "\xc3"} },
			wantIs: []error{wire.ErrInvalidJob}, wantMsg: `metadata value of key "k" is not valid UTF-8`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := validJob()
			tt.edit(j)
			subject := tt.subject
			switch subject {
			case "":
				subject = "default"
			case "-":
				subject = ""
			}
			err := j.Validate(subject, tt.max)
			if tt.wantIs == nil {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate() = nil, want an error")
			}
			for _, target := range tt.wantIs {
				if !errors.Is(err, target) {
					t.Errorf("Validate() = %v, want an error wrapping %v", err, target)
				}
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("Validate() = %q, want it to contain %q", err, tt.wantMsg)
			}
			if !strings.HasPrefix(err.Error(), "invalid job: ") {
				t.Errorf("Validate() = %q, want it to start with %q", err, "invalid job: ")
			}
		})
	}
}

func TestJobValidateFillsDefaults(t *testing.T) {
	tests := []struct {
		name        string
		job         wire.Job
		subject     string
		wantSandbox string
		wantMode    string
	}{
		{name: "an empty sandbox and mode get the subject's sandbox and plan",
			job: wire.Job{ExecutionID: "e", Script: "x"}, subject: "py", wantSandbox: "py", wantMode: wire.ModePlan},
		{name: "a sandbox that matches the subject and a given mode are kept",
			job: wire.Job{ExecutionID: "e", Script: "x", Sandbox: "py", Mode: wire.ModeInteractive}, subject: "py", wantSandbox: "py", wantMode: wire.ModeInteractive},
		{name: "without a subject the body's sandbox is kept",
			job: wire.Job{ExecutionID: "e", Script: "x", Sandbox: "py"}, wantSandbox: "py", wantMode: wire.ModePlan},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := tt.job
			if err := j.Validate(tt.subject, 0); err != nil {
				t.Fatalf("Validate() = %v", err)
			}
			if j.Sandbox != tt.wantSandbox || j.Mode != tt.wantMode {
				t.Errorf("after Validate: sandbox %q, mode %q; want %q, %q", j.Sandbox, j.Mode, tt.wantSandbox, tt.wantMode)
			}
		})
	}
}

func TestJobValidateLeavesAnInvalidJobUnchanged(t *testing.T) {
	j := wire.Job{ExecutionID: "e", Script: ""}
	before := j
	if err := j.Validate("py", 0); err == nil {
		t.Fatal("Validate() = nil, want an error for the missing script")
	}
	if !reflect.DeepEqual(j, before) {
		t.Errorf("Validate changed an invalid job: %+v, was %+v", j, before)
	}
}
