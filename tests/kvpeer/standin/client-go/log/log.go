// SPDX-License-Identifier: Apache-2.0
// Stand-in for kubevirt.io/client-go/log as migration-proxy.go uses it: one JSON object a line on
// stderr in KubeVirt's form (component, level, msg, pos, timestamp, the With() fields, reason).
// V(n) logs only up to Verbosity, 2 as virt-handler's default.

package log

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"
)

var (
	// Component is the "component" field (virt-handler in KubeVirt).
	Component = "virt-handler"
	// Verbosity: the highest V(n) level that is written.
	Verbosity = 2
	// Out is where the lines go.
	Out io.Writer = os.Stderr
	mu  sync.Mutex
)

type FilteredLogger struct {
	fields []interface{}
	reason error
}

var Log = &FilteredLogger{}

func (l FilteredLogger) With(obj ...interface{}) *FilteredLogger {
	l.fields = append(append([]interface{}(nil), l.fields...), obj...)
	return &l
}

func (l FilteredLogger) Reason(err error) *FilteredLogger {
	l.reason = err
	return &l
}

func (l FilteredLogger) V(level int) *FilteredVerbosityLogger {
	return &FilteredVerbosityLogger{l: l, on: level <= Verbosity}
}

func (l FilteredLogger) Info(msg string) { l.write("info", msg) }
func (l FilteredLogger) Infof(msg string, args ...interface{}) {
	l.write("info", fmt.Sprintf(msg, args...))
}
func (l FilteredLogger) Warning(msg string) { l.write("warning", msg) }
func (l FilteredLogger) Warningf(msg string, args ...interface{}) {
	l.write("warning", fmt.Sprintf(msg, args...))
}
func (l FilteredLogger) Error(msg string) { l.write("error", msg) }
func (l FilteredLogger) Errorf(msg string, args ...interface{}) {
	l.write("error", fmt.Sprintf(msg, args...))
}

// write puts one line out; pos is the caller of Info, Errorf, ....
func (l FilteredLogger) write(level, msg string) {
	entry := map[string]interface{}{"component": Component, "level": level, "msg": msg,
		"timestamp": time.Now().UTC().Format("2006-01-02T15:04:05.000000Z")}
	if _, file, line, ok := runtime.Caller(2); ok {
		entry["pos"] = fmt.Sprintf("%s:%d", filepath.Base(file), line)
	}
	for i := 0; i+1 < len(l.fields); i += 2 {
		entry[fmt.Sprint(l.fields[i])] = fmt.Sprint(l.fields[i+1])
	}
	if l.reason != nil {
		entry["reason"] = l.reason.Error()
	}
	b, err := json.Marshal(entry)
	if err != nil {
		b = []byte(fmt.Sprintf(`{"level":"error","msg":%q}`, err.Error()))
	}
	mu.Lock()
	defer mu.Unlock()
	Out.Write(append(b, '\n'))
}

type FilteredVerbosityLogger struct {
	l  FilteredLogger
	on bool
}

func (v FilteredVerbosityLogger) Info(msg string) {
	if v.on {
		v.l.write("info", msg)
	}
}

func (v FilteredVerbosityLogger) Infof(msg string, args ...interface{}) {
	if v.on {
		v.l.write("info", fmt.Sprintf(msg, args...))
	}
}
