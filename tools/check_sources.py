#!/usr/bin/env python3
"""The source rules the build checks (issue 28), each a ctest (tests/source/CMakeLists.txt):

  function-size   no function over 120 lines (from its opening brace's line to its closing one) in src/, bench/,
                  tests/ and fuzz/, generated files aside;
  protocol-keys   no string literal naming an annotation, label or resource key ("hami.io/...", "nvidia.com/...",
                  "dynmig.io/...") in src/ or bench/ outside src/protocol/: the keys are src/protocol's constants;
  layers          a room of src/ includes only the rooms below it (LAYERS): the domain core (mig) knows no
                  wire, the wire contract (protocol) no Kubernetes client, the adapters not each other;
  clock           no direct clock, sleep or timed wait (absl::Now, absl::SleepFor, std::chrono clocks,
                  sleep_for, timed condition-variable waits, ...) in src/ outside src/common/clock.* and the lock
                  primitives (src/common/mutex.h): time comes
                  through the injected dynmig::Clock.

Usage: tools/check_sources.py [--root DIR] [RULE ...]; with no rule, all. Prints each violation as
`path:line: rule: what`, exits 1 when there is one. The scan is lexical: comments, string and character
literals are told apart from code; a brace opens a function body when the text before it (since the last ';',
'{' or '}') has a parameter list and is not a class, namespace, enum or initializer. Lambdas and local classes
count toward their enclosing function.
"""
import argparse
import os
import re
import sys

LIMIT = 120

GENERATED = ('.pb.', '.grpc.pb.')


def strip(text, literals=None):
    """Replaces comments and literals by spaces, keeping newlines, so offsets and line numbers stay. When
    `literals` is a list, appends (line, text) for every string literal."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            out.append(' ' * (j - i))
            i = j
        elif text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r'[^\n]', ' ', text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == '_')):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = ')' + m.group(1) + '"'
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            if literals is not None:
                literals.append((text.count('\n', 0, i) + 1, text[i + m.end():j - len(end)]))
            out.append('""' + re.sub(r'[^\n]', ' ', text[i + 2:j]))
            i = j
        elif c in '"\'':
            if c == '\'' and i > 0 and text[i - 1].isalnum():  # digit separator 1'000
                out.append(' ')
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == '\\' else 1
            j = min(j + 1, n)
            if literals is not None and c == '"':
                literals.append((text.count('\n', 0, i) + 1, text[i + 1:j - 1]))
            out.append(c + re.sub(r'[^\n]', ' ', text[i + 1:j - 1]) + c)
            i = j
        elif c == '#' and (i == 0 or text[i - 1] == '\n'):
            j = i
            while True:  # preprocessor line with continuations
                k = text.find('\n', j)
                if k < 0:
                    k = n
                    break
                if text[k - 1] != '\\':
                    break
                j = k + 1
            out.append(re.sub(r'[^\n]', ' ', text[i:k]))
            i = k
        else:
            out.append(c)
            i += 1
    return ''.join(out)


NOT_FUNCTION = re.compile(r'\b(namespace|class|struct|union|enum)\b')
CONTROL = re.compile(r'^\s*(if|for|while|switch|catch|do|else|return)\b')


def functions(text):
    text = strip(text)
    stack = []  # kinds: 'scope' (namespace/class/extern), 'function', 'block'
    starts = []
    found = []
    last = 0
    for i, c in enumerate(text):
        if c in ';':
            last = i + 1
        elif c == '{':
            head = text[last:i]
            kind = 'block'
            if 'function' not in stack:
                flat = ' '.join(head.split())
                if NOT_FUNCTION.search(flat.split('(')[0]) or flat.startswith('extern'):
                    kind = 'scope'
                elif ')' in flat and not CONTROL.match(flat) and not flat.endswith('='):
                    kind = 'function'
                elif flat == '' or flat.endswith('=') or flat.endswith(','):
                    kind = 'block'
                else:
                    kind = 'scope' if '(' not in flat else 'function'
            stack.append(kind)
            starts.append((i, head))
            last = i + 1
        elif c == '}':
            if stack:
                kind = stack.pop()
                start, head = starts.pop()
                if kind == 'function' and 'function' not in stack:
                    first = text.count('\n', 0, start) + 1
                    lines = text.count('\n', start, i) + 1
                    name = ' '.join(head.split())
                    m = re.search(r'([\w:~<>=!+\-*/\[\]]+)\s*\(', name)
                    found.append((lines, first, m.group(1) if m else name[:60]))
            last = i + 1
    return found



KEY_LITERAL = re.compile(r'^(hami\.io|nvidia\.com|dynmig\.io)/')
CLOCK_CALL = re.compile(
    r'\babsl::(Now|SleepFor|GetCurrentTimeNanos)\s*\(|\bsleep_(for|until)\s*\(|'
    r'\b(steady_clock|system_clock|high_resolution_clock)\b|\.(wait_for|wait_until)\s*\(|'
    r'\b(WaitWithTimeout|WaitWithDeadline|AwaitWithTimeout|AwaitWithDeadline|LockWhenWithTimeout|'
    r'LockWhenWithDeadline)\s*\(|\b(usleep|nanosleep|gettimeofday|clock_gettime)\s*\(|'
    r'(?<![\w.>])time\s*\(\s*(nullptr|NULL|0)\s*\)')


def cxx_files(root, dirs):
    for d in dirs:
        base = os.path.join(root, d)
        for dirpath, _, names in os.walk(base):
            for name in sorted(names):
                if name.endswith(('.cc', '.h', '.cpp')) and not any(g in name for g in GENERATED):
                    path = os.path.join(dirpath, name)
                    yield os.path.relpath(path, root), path


def is_generated(text):
    return text.startswith('// GENERATED')


def check_function_size(root):
    for rel, path in cxx_files(root, ['src', 'bench', 'tests', 'fuzz']):
        text = open(path, encoding='utf-8', errors='replace').read()
        if is_generated(text):
            continue
        for lines, first, name in functions(text):
            if lines > LIMIT:
                yield rel, first, f'{name} is {lines} lines (limit {LIMIT})'


def check_protocol_keys(root):
    for rel, path in cxx_files(root, ['src', 'bench']):
        if rel.startswith('src/protocol/'):
            continue
        literals = []
        strip(open(path, encoding='utf-8', errors='replace').read(), literals)
        for line, lit in literals:
            if KEY_LITERAL.match(lit):
                yield rel, line, f'the key literal "{lit}" belongs in src/protocol'


def check_clock(root):
    for rel, path in cxx_files(root, ['src']):
        if rel.startswith('src/common/clock.') or rel == 'src/common/mutex.h':
            continue  # the seam itself, and the lock primitives it waits on
        code = strip(open(path, encoding='utf-8', errors='replace').read())
        for m in CLOCK_CALL.finditer(code):
            line = code.count('\n', 0, m.start()) + 1
            yield rel, line, f'direct clock use "{m.group(0).strip()}": take a dynmig::Clock'


# Each room of src/ and the rooms it may include; a room not listed here fails the rule until it is placed.
LAYERS = {
    'common': set(),
    'mig': {'common'},
    'protocol': {'common', 'mig'},
    'nvml': {'common', 'mig'},
    'kube': {'common'},
    'webhook': {'common', 'mig', 'protocol'},
    'sim': {'common', 'mig', 'protocol'},
    'scheduler': {'common', 'mig', 'protocol', 'kube', 'webhook'},
    'deviceplugin': {'common', 'mig', 'protocol', 'kube', 'nvml'},
    'ops': {'common', 'mig', 'protocol', 'kube', 'nvml', 'scheduler'},
    'local': {'common', 'mig', 'protocol', 'kube', 'nvml', 'webhook', 'scheduler', 'deviceplugin', 'ops'},
    'cli': {'common', 'mig', 'protocol', 'kube', 'nvml', 'webhook', 'sim', 'scheduler', 'deviceplugin', 'ops',
            'local'},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/', re.M)


def check_layers(root):
    rooms = set(os.listdir(os.path.join(root, 'src')))
    for rel, path in cxx_files(root, ['src']):
        room = rel.split('/')[1]
        if room not in LAYERS:
            yield rel, 1, f'src/{room} is not placed in the layers (tools/check_sources.py LAYERS)'
            continue
        text = open(path, encoding='utf-8', errors='replace').read()
        for m in INCLUDE.finditer(text):
            target = m.group(1)
            if target != room and target in rooms and target not in LAYERS[room]:
                line = text.count('\n', 0, m.start()) + 1
                yield rel, line, f'src/{room} may not include src/{target} (it sits above or beside it)'


RULES = {'function-size': check_function_size, 'layers': check_layers, 'protocol-keys': check_protocol_keys, 'clock': check_clock}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--root', default=os.environ.get('DYNMIG_SOURCE_DIR') or
                    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument('rules', nargs='*', help='function-size, layers, protocol-keys, clock (default: all)')
    args = ap.parse_args()
    rules = args.rules or list(RULES)
    bad = 0
    for rule in rules:
        if rule not in RULES:
            print(f'unknown rule {rule}; rules: {", ".join(RULES)}', file=sys.stderr)
            return 2
        for rel, line, what in RULES[rule](args.root):
            print(f'{rel}:{line}: {rule}: {what}')
            bad += 1
    if bad:
        print(f'{bad} violation(s) of the source rules (tools/check_sources.py)', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
