#!/usr/bin/env python3
"""gpu-check's results file: what each step found, case by case, kept from one call to the next.

tools/gpu-check runs its steps in pieces (a ctest run, one sanitizer run of a suite or of one test
case, one benchmark) and records every finished piece here at once. A call cut short by its time
budget therefore loses nothing, and the next call with the same step carries on where it stopped.
The same file is the baseline of a later run: `compare` lists the cases that fail now and did not
before (regressions) and those that pass now and failed before (fixes).

  results.py begin RESULTS STEP           start STEP afresh, or resume it when a call left it unfinished
  results.py case RESULTS STEP NAME STATUS [--log FILE] [--detail TEXT] [--seconds S]
  results.py has RESULTS STEP NAME        exit 0 when NAME already has a result in STEP
  results.py end RESULTS STEP SECONDS finished|unfinished
  results.py finished RESULTS STEP        exit 0 when an earlier call finished STEP
  results.py ctest-pending RESULTS STEP LISTING [REGEX]
      the numbers (for ctest -I) of the tests in LISTING (ctest --show-only=json-v1) with no result
      yet; with REGEX, of those whose names it matches (re.search) only; exit 4 when it matches none
  results.py ctest-ingest RESULTS STEP LISTING OUTPUT TEST_TIMEOUT STOP_EPOCH [REGEX]
      records the tests that ctest's OUTPUT reports; exit 3 when some (of those REGEX matches) are
      left for the next call
  results.py versions RESULTS BUILD_DIR   records the GPU, driver, CUDA runtime, cuDNN and NCCL versions
  results.py summary RESULTS [--baseline FILE]
  results.py compare RESULTS BASELINE     exit 1 when there are regressions

A case's status is ok, FAIL, TIMEOUT (it ran past its own limit) or SKIP. A step is ok, FAIL,
TIMEOUT, SKIP, or UNFINISHED while a call's budget ran out before its last piece.
"""
import datetime
import json
import os
import re
import subprocess
import sys

FORMAT = "weft-gpu-check-results/1"
STEP_ORDER = ["build", "test", "memcheck", "racecheck", "initcheck", "synccheck", "memcheck-virtual4",
              "racecheck-virtual4", "initcheck-virtual4", "synccheck-virtual4", "bench"]
FAILING = ("FAIL", "TIMEOUT")


def load(path):
    try:
        with open(path) as f:
            data = json.load(f)
        if data.get("format") == FORMAT:
            return data
    except (OSError, ValueError):
        pass
    return {"format": FORMAT, "versions": {}, "steps": {}}


def save(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)  # a call killed mid-write leaves the previous file whole


def now():
    return datetime.datetime.now().isoformat(timespec="seconds")


def ordered_steps(data):
    steps = data.get("steps", {})
    return [s for s in STEP_ORDER if s in steps] + [s for s in steps if s not in STEP_ORDER]


def step_status(step):
    if not step.get("finished"):
        return "UNFINISHED"
    statuses = [c["status"] for c in step.get("cases", {}).values()]
    for status in FAILING:
        if status in statuses:
            return status
    if not statuses or all(s == "SKIP" for s in statuses):
        return "SKIP"
    return "ok"


# --- recording ------------------------------------------------------------------------------

def cmd_begin(path, name):
    data = load(path)
    step = data["steps"].get(name)
    if step is not None and not step.get("finished"):
        print("resume")  # the previous call ran out of budget inside this step
    else:
        data["steps"][name] = {"finished": False, "seconds": 0, "cases": {}}
        print("fresh")
    data["steps"][name]["updated"] = now()
    save(path, data)


def cmd_case(path, name, case, status, options):
    data = load(path)
    step = data["steps"].setdefault(name, {"finished": False, "seconds": 0, "cases": {}})
    record = {"status": status}
    for key in ("log", "detail"):
        if options.get(key):
            record[key] = options[key]
    if options.get("seconds"):
        record["seconds"] = round(float(options["seconds"]), 2)
    step["cases"][case] = record
    step["updated"] = now()
    save(path, data)


def cmd_has(path, name, case):
    return 0 if case in load(path)["steps"].get(name, {}).get("cases", {}) else 1


def cmd_finished(path, name):
    return 0 if load(path)["steps"].get(name, {}).get("finished") else 1


def cmd_end(path, name, seconds, state):
    data = load(path)
    step = data["steps"].setdefault(name, {"finished": False, "seconds": 0, "cases": {}})
    step["seconds"] = step.get("seconds", 0) + int(seconds)
    step["finished"] = state == "finished"
    step["updated"] = now()
    save(path, data)


# --- ctest ----------------------------------------------------------------------------------

def ctest_names(listing):
    with open(listing) as f:
        return [t["name"] for t in json.load(f)["tests"]]  # ctest numbers them from 1 in this order


def selected(names, regex):
    """The names REGEX matches (all of them when it is empty)."""
    pattern = re.compile(regex or "")
    return [n for n in names if pattern.search(n)]


def cmd_ctest_pending(path, name, listing, regex=""):
    cases = load(path)["steps"].get(name, {}).get("cases", {})
    names = ctest_names(listing)
    wanted = set(selected(names, regex))
    if not wanted:
        print("results.py: no CTest entry of %s matches %r" % (listing, regex), file=sys.stderr)
        return 4  # a selection of nothing is a mistake, not a step with nothing left to do
    print(",".join(str(i + 1) for i, test in enumerate(names) if test in wanted and test not in cases))


def parse_ctest_output(text, names):
    """(number, status, seconds) for each test whose result line is in ctest's output."""
    results = []
    for line in text.splitlines():
        m = re.match(r"\s*\d+/\d+ Test\s+#(\d+): ", line)
        if not m or not 0 < int(m.group(1)) <= len(names):
            continue
        number = int(m.group(1))
        rest = line[m.end():]
        rest = rest[len(names[number - 1]):] if rest.startswith(names[number - 1]) else rest
        seconds = re.findall(r"([0-9.]+) sec", rest)
        if "Passed" in rest:
            status = "ok"
        elif "Skipped" in rest:
            status = "SKIP"
        elif "Timeout" in rest:
            status = "TIMEOUT"
        else:
            status = "FAIL"  # ***Failed, ***Exception, ***Not Run
        results.append((number, status, float(seconds[-1]) if seconds else 0.0))
    return results


def cmd_ctest_ingest(path, name, listing, output, test_timeout, stop_epoch, regex=""):
    names = ctest_names(listing)
    with open(output, errors="replace") as f:
        text = f.read()
    data = load(path)
    step = data["steps"].setdefault(name, {"finished": False, "seconds": 0, "cases": {}})
    stopped = datetime.datetime.now().timestamp() >= float(stop_epoch) - 2
    for number, status, seconds in parse_ctest_output(text, names):
        # --stop-time kills the tests still running when the budget ends; they report Timeout
        # before their own limit. They are left for the next call rather than recorded.
        if status == "TIMEOUT" and stopped and seconds < float(test_timeout) - 2:
            continue
        record = {"status": status, "seconds": seconds}
        if status in FAILING:
            record["log"] = output
        step["cases"][names[number - 1]] = record
    step["updated"] = now()
    save(path, data)
    return 0 if all(n in step["cases"] for n in selected(names, regex)) else 3


# --- versions -------------------------------------------------------------------------------

def run(command):
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def header_version(path, names):
    """'9.19.0' from the #define NAME lines of a header, or '' when it is not there."""
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return ""
    parts = [re.search(r"#define\s+%s\s+(\d+)" % n, text) for n in names]
    return ".".join(p.group(1) for p in parts) if all(parts) else ""


def read_kit_env(path):
    """The KEY=VALUE lines of a kit's kit.env, or {} where there is none."""
    try:
        with open(path) as f:
            pairs = (line.strip().split("=", 1) for line in f if "=" in line)
            return {key: value.strip("'") for key, value in pairs}
    except OSError:
        return {}


def cmd_versions(path, build):
    cache = {}
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            for line in f:
                m = re.match(r"([A-Za-z_0-9]+):[A-Z]+=(.*)", line.strip())
                if m:
                    cache[m.group(1)] = m.group(2)
    except OSError:
        pass
    versions = {}
    smi = run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]).strip().splitlines()
    if smi:
        versions["gpu"], _, versions["driver"] = (part.strip() for part in smi[0].rpartition(","))
    m = re.search(r"CUDA Version:\s*([0-9.]+)", run(["nvidia-smi"]))
    if m:
        versions["driver_cuda"] = m.group(1)
    nvcc = cache.get("CMAKE_CUDA_COMPILER", "")
    if nvcc:
        m = re.search(r"release [0-9.]+, V([0-9.]+)", run([nvcc, "--version"]))
        if m:
            versions["nvcc"] = m.group(1)
        root = os.path.dirname(os.path.dirname(nvcc))
        for include in ("include", "targets/x86_64-linux/include", "targets/sbsa-linux/include"):
            number = header_version(os.path.join(root, include, "cuda_runtime_api.h"), ["CUDART_VERSION"])
            if number:
                versions["cuda_runtime"] = "%d.%d" % (int(number) // 1000, int(number) % 1000 // 10)
                break
    cudnn = header_version(os.path.join(cache.get("WEFT_CUDNN_INCLUDE", ""), "cudnn_version.h"),
                           ["CUDNN_MAJOR", "CUDNN_MINOR", "CUDNN_PATCHLEVEL"])
    if cudnn:
        versions["cudnn"] = cudnn
    nccl = header_version(os.path.join(cache.get("WEFT_NCCL_INCLUDE", ""), "nccl.h"),
                          ["NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH"])
    if nccl:
        versions["nccl"] = nccl
    # A kit's build (tools/gpu-kit) was compiled elsewhere: its compiler and headers are the ones
    # it names, not whatever this machine has at the same paths.
    kit = read_kit_env(os.path.join(build, "kit.env"))
    for key, kit_key in (("nvcc", "KIT_NVCC"), ("cudnn", "KIT_CUDNN"), ("nccl", "KIT_NCCL")):
        if kit_key in kit:
            versions[key] = "%s (the kit's)" % kit[kit_key]
    data = load(path)
    data["versions"].update(versions)  # what this call could not read stays as an earlier call read it
    save(path, data)


def versions_line(versions):
    labels = [("gpu", "GPU"), ("driver", "driver"), ("driver_cuda", "driver's CUDA"),
              ("cuda_runtime", "CUDA runtime"), ("nvcc", "nvcc"), ("cudnn", "cuDNN"), ("nccl", "NCCL")]
    return "; ".join("%s %s" % (label, versions.get(key, "unknown")) for key, label in labels)


# --- summary and comparison -----------------------------------------------------------------

def compare(data, baseline):
    """(regressions, fixes): (step, case, status now, status in the baseline) for each change."""
    regressions, fixes = [], []
    for name in ordered_steps(data):
        before = baseline.get("steps", {}).get(name, {}).get("cases", {})
        for case, record in sorted(data["steps"][name].get("cases", {}).items()):
            status = record["status"]
            was = before.get(case, {}).get("status", "not run")
            if status in FAILING and was not in FAILING:
                regressions.append((name, case, status, was))
            elif status == "ok" and was in FAILING:
                fixes.append((name, case, status, was))
    return regressions, fixes


def print_comparison(data, baseline, baseline_path):
    regressions, fixes = compare(data, baseline)
    print("compared with %s: %d regression%s, %d fix%s" % (baseline_path, len(regressions),
          "" if len(regressions) == 1 else "s", len(fixes), "" if len(fixes) == 1 else "es"))
    for kind, changes in (("regression", regressions), ("fix", fixes)):
        for name, case, status, was in changes:
            print("  %-10s %-18s %s: %s (baseline: %s)" % (kind, name, case, status, was))
    return regressions


def cmd_summary(path, baseline_path):
    data = load(path)
    print("== gpu-check summary (%s)" % path)
    print(versions_line(data.get("versions", {})))
    print("%-18s %-10s %7s  %s" % ("step", "result", "time", "cases"))
    failing = []
    for name in ordered_steps(data):
        step = data["steps"][name]
        counts = {}
        for case, record in step.get("cases", {}).items():
            counts[record["status"]] = counts.get(record["status"], 0) + 1
            if record["status"] in FAILING:
                failing.append((name, case, record))
        detail = ", ".join("%d %s" % (n, s) for s, n in sorted(counts.items())) or "none"
        if not step.get("finished"):
            detail += "; out of budget: run --steps %s again to go on" % name
        print("%-18s %-10s %6ss  %s" % (name, step_status(step), step.get("seconds", 0), detail))
    if failing:
        print("failing cases (%d):" % len(failing))
        for name, case, record in failing:
            extra = "; ".join(x for x in (record.get("detail"), record.get("log")) if x)
            print("  %-18s %-7s %s%s" % (name, record["status"], case, "  (%s)" % extra if extra else ""))
    else:
        print("failing cases: none")
    if baseline_path:
        print_comparison(data, load(baseline_path), baseline_path)
    return 1 if any(step_status(data["steps"][n]) in FAILING for n in data["steps"]) else 0


def cmd_compare(path, baseline_path):
    return 1 if print_comparison(load(path), load(baseline_path), baseline_path) else 0


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    command, path, args = argv[1], argv[2], argv[3:]
    options = {}
    while len(args) >= 2 and args[-2].startswith("--"):
        options[args[-2][2:]] = args[-1]
        args = args[:-2]
    if command == "begin" and len(args) == 1:
        return cmd_begin(path, args[0]) or 0
    if command == "case" and len(args) == 3:
        return cmd_case(path, args[0], args[1], args[2], options) or 0
    if command == "has" and len(args) == 2:
        return cmd_has(path, *args)
    if command == "finished" and len(args) == 1:
        return cmd_finished(path, args[0])
    if command == "end" and len(args) == 3:
        return cmd_end(path, *args) or 0
    if command == "ctest-pending" and len(args) in (2, 3):
        return cmd_ctest_pending(path, *args) or 0
    if command == "ctest-ingest" and len(args) in (5, 6):
        return cmd_ctest_ingest(path, *args)
    if command == "versions" and len(args) == 1:
        return cmd_versions(path, args[0]) or 0
    if command == "summary" and not args:
        return cmd_summary(path, options.get("baseline"))
    if command == "compare" and len(args) == 1:
        return cmd_compare(path, args[0])
    print("results.py: bad arguments: %s (see the top of %s)" % (" ".join(argv[1:]), argv[0]), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
