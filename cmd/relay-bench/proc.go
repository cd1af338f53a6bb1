package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// procStats reads a process's resident memory and CPU time from /proc.
type procStats struct {
	RSSKiB     int64   `json:"rss_kib"`
	CPUSeconds float64 `json:"cpu_seconds"`
}

const clockTicks = 100 // USER_HZ on Linux

func readProc(pid int) (procStats, error) {
	var st procStats
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return st, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			st.RSSKiB, _ = strconv.ParseInt(strings.Fields(v)[0], 10, 64)
		}
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return st, err
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	rest := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, _ := strconv.ParseFloat(rest[11], 64)
	stime, _ := strconv.ParseFloat(rest[12], 64)
	st.CPUSeconds = (utime + stime) / clockTicks
	return st, nil
}

func selfProc() procStats {
	st, _ := readProc(os.Getpid())
	return st
}
