#!/usr/bin/env python3
"""Writes tests/data/tokenizer_corpus.jsonl: strings the tokenizer conformance tests encode
with fusetune and with the reference implementation. Hand-written cases for the tricky parts
of tokenizer.json pipelines plus seeded random mixtures. Deterministic: rerun to regenerate.

    python3 tools/tokenizer-ref/make_corpus.py > tests/data/tokenizer_corpus.jsonl
"""
import json
import random
import sys

CASES = [
    # empty and whitespace
    "", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r\n\r\n", " \n ", "\t\t\tx", "x\t\t\t",
    "a  b", "a   b", "a    b    c", "a \n b", "a\n\n\nb", "a \t\n\r b", "trailing   ", "   leading",
    "line1\nline2\r\nline3\rline4", "  \n  \n  ", "x" + " " * 40 + "y", "\n" * 17 + "end",
    " " * 200, "tab\tseparated\tvalues\t1\t2\t3", "mixed \t \t  \n\t whitespace",
    # plain English, case
    "Hello world", "Hello, world!", "hello world", "HELLO WORLD", "Once upon a time",
    "Lily went to the park.", "The quick brown fox jumps over the lazy dog.",
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG!!!", "CamelCaseIdentifierName",
    "snake_case_identifier_name", "kebab-case-identifier-name", "ALLCAPS and lowercase MiXeD",
    "Mr. Smith's dog... barked?! (twice)", "e.g., i.e., etc.", "A", "a", "I", "?", "!", ".",
    # contractions
    "don't", "DON'T", "I'm", "I'M", "we'll", "WE'LL", "she's", "SHE'S", "she'S", "they've",
    "THEY'VE", "you're", "YOU'RE", "he'd", "HE'D", "'s", "'S", "'ll", "'LL", "it's", "It'S",
    "y'all", "rock 'n' roll", "'quoted'", "the '90s", "o'clock", "it\u2019s (curly)",
    "don\u2019t", "' s", "''", "'''s", "x's y's z'S", "the dog's bone's owner's", "Ｉ'ＭＦＩＮＥ",
    "\u017f's long s \u017f", "'\u017f", "\u212a'K kelvin",
    # digits
    "0", "1", "12", "123", "1234", "12345", "123456", "1234567", "12345678901234567890",
    "3.14159", "-42", "+1 (555) 123-4567", "1,000,000", "1.000.000,50", "2024-01-31",
    "12:34:56", "v1.2.3", "0x1F", "1e-10", "99%", "$100.00", "\u20ac20", "a1b2c3",
    "abc123def456", "\u0661\u0662\u0663 arabic-indic digits", "\uff11\uff12\uff13 fullwidth digits",
    "\u00b2\u00b3 superscripts x\u00b2", "\u2160\u2161\u2162 roman numerals", "\u00bd \u00bc fractions",
    "1st 2nd 3rd 4th", "year 1999 and 2000", "0000000", "1 2 3 4 5",
    # code
    "def f(x):\n    return x + 1\n", "def f(x):\n\treturn x * 2\n",
    "int main() {\n  printf(\"hi\\n\");\n  return 0;\n}\n",
    "for (int i = 0; i < n; ++i) { a[i] += b[i]; }", "if (x<y && y>z) { return; }",
    "#include <vector>\n#include <string>\n", "std::vector<std::string> v{\"a\", \"b\"};",
    "x = {'key': [1, 2, 3], \"other\": None}", "{\"json\": true, \"n\": 1.5e3, \"arr\": []}",
    "<html><body><p class=\"x\">Hi</p></body></html>", "<div>\n\t<span>text</span>\n</div>",
    "SELECT * FROM users WHERE id = 42;", "git commit -m \"fix: the bug\"",
    "    indented four\n        indented eight\n", "\tone tab\n\t\ttwo tabs\n",
    "a=b+c*d/e-f%g^h|i&j~k", "x->y; p::q; r=>s; t<=u; v>=w; a!=b; c==d",
    "// comment\n/* block */\n# hash\n-- dash", "print('hello')  # trailing comment",
    "```python\nprint(1)\n```", "$ echo $HOME && ls -la ~/", "C:\\Users\\name\\file.txt",
    "https://example.com/path?query=1&x=y#frag", "user@example.com", "@mention #hashtag",
    "<|begin_of_text|> looks like code < | > but isn't", "a<b>c</b>d", "<<>>", "<|", "|>", "<||>",
    # Markdown / LaTeX / math
    "# Title\n\n## Subtitle\n\n- item 1\n- item 2\n", "**bold** _italic_ `code`",
    "| a | b |\n|---|---|\n| 1 | 2 |", "$\\frac{a}{b} + \\sqrt{x^2}$", "\u2211\u222b\u2202\u2207 \u221e \u2248 \u2260 \u2264",
    "\u03b1\u03b2\u03b3 \u0394\u03a9 greek", "E = mc\u00b2",
    # special-token lookalikes and real ones
    "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|begin_of_text|><|begin_of_text|>", "text<|eot_id|>more text", " <|eot_id|> ", "<|eot_id|>\n",
    "<|reserved_special_token_0|>", "<|reserved_special_token_250|>", "<|reserved_special_token_999|>",
    "<|begin_of", "<|begin_of_text", "begin_of_text|>", "<<|eot_id|>>", "<|EOT_ID|>", "< |eot_id| >",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|endoftext|><|endoftext|>", "a<|endoftext|>b",
    "<think>\nreasoning\n</think>", "<tool_call>{}</tool_call>", "<|fim_prefix|>x<|fim_suffix|>",
    "<s>", "</s>", "<unk>", "<s>Hello</s>", "a<s>b</s>c", "<s> spaced </s>", "<S>", "<0x41>",
    "<0x0A>", "< s >", "<pad>", "[CLS] [SEP] [MASK]",
    # CJK
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01", "\u6211\u559c\u6b22\u5403\u82f9\u679c\u3002",
    "\u4e2d\u6587\u548cEnglish\u6df7\u5408text", "\u3053\u3093\u306b\u3061\u306f\u4e16\u754c",
    "\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a", "\u6771\u4eac\u90fd\u6e0b\u8c37\u533a 1-2-3",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8", "\uc548\ub155\ud558\uc138\uc694", "\u1100\u1161\u11a8 decomposed hangul",
    "\u1112\u1161\u11ab\u1100\u1173\u11af", "\uff21\uff22\uff23 fullwidth latin", "\u3000ideographic\u3000space\u3000",
    "\u300c\u5f15\u7528\u300d\u3010\u62ec\u5f27\u3011", "\u4e00\u4e8c\u4e09\u56db\u4e94\u516d\u4e03\u516b\u4e5d\u5341",
    # RTL and other scripts
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645", "\u0627\u0644\u0639\u064e\u0631\u064e\u0628\u0650\u064a\u0651\u064e\u0629 with harakat",
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd", "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a", "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!",
    "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5", "\u10d2\u10d0\u10db\u10d0\u10e0\u10ef\u10dd\u10d1\u10d0",
    "\u0531\u0562\u0563 armenian", "\u1200\u1208\u1218 ethiopic", "\u0b95\u0bae\u0bb2\u0bbe tamil",
    "mixed \u0645\u0631\u062d\u0628\u0627 and English \u05e9\u05dc\u05d5\u05dd",
    # emoji
    "\U0001f44d", "\U0001f600\U0001f601\U0001f602", "I \u2764\ufe0f NY", "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 family",
    "\U0001f44b\U0001f3fd wave", "\U0001f1eb\U0001f1f7\U0001f1e9\U0001f1ea flags", "1\ufe0f\u20e3 keycap",
    "\U0001f3f3\ufe0f\u200d\U0001f308 rainbow flag", "\U0001f9d1\u200d\U0001f4bb technologist",
    "emoji\U0001f680in\U0001f680words", "\u2603\u2605\u263a", "\U0001f600 " * 5,
    # combining marks and normalization
    "e\u0301", "cafe\u0301", "caf\u00e9", "\u00c5 \u212b \u0041\u030a angstrom variants",
    "n\u0303o\u0308u\u0308", "a\u0300\u0301\u0302\u0303\u0304 stacked", "\u0301 leading combining",
    "Vi\u1ec7t Nam", "Vie\u0323\u0302t Nam decomposed", "\u1e9b\u0323", "\u2126 ohm \u03a9 omega",
    "\ufb01 ligature fi", "\u00c7a va? \u00e7a va.", "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319 zalgo",
    "\u0915\u094d\u0937", "\u1100\u1161", "\uac00\u11a8",
    # Unicode whitespace and format characters
    "a\u00a0b", "a\u00a0\u00a0b", "\u00a0leading nbsp", "a\u2009thin\u2009space", "a\u3000b",
    "a\u2028b", "a\u2029b", "a\u0085b", "x  \u0085\n y", "a\u200bb", "a\u200cb\u200dc", "\ufeffbom",
    "a\ufeff b", "a\u180eb c", "a \u180e b", "a\u000bb\u000cc", "x\u001cy\u001dz\u001ey\u001fz",
    "tab\u00a0\t\u00a0mix", "\u2002\u2003\u2004\u2005 en/em spaces", "\u202f\u205f narrow",
    "a\u00adb soft hyphen", "\u2060word joiner\u2060",
    # control characters
    "\u0000", "a\u0000b", "\u0001\u0002\u0003", "bell\u0007", "esc\u001b[31mred\u001b[0m",
    "del\u007f", "\u0080\u0081\u009f c1 controls",
    # long inputs
    "a" * 300, "ab" * 200, "z" * 1000, "9" * 100, "!" * 300, "\u4e2d" * 200, "\U0001f600" * 60,
    "word " * 150, "supercalifragilisticexpialidocious", "pneumonoultramicroscopicsilicovolcanoconiosis",
    "Llanfairpwllgwyngyllgogerychwyrndrobwllllantysiliogogogoch",
    # punctuation runs
    "...", "!!!???", "---", "___", "***", "=====", "~~~", "\u2026 ellipsis", "\u2014em\u2013en-dash",
    "\u00ab\u00bb \u201c\u201d \u2018\u2019 quotes", "\u00bf\u00a1Spanish!?", "a,b;c:d", "(((nested)))",
    "[[1,2],[3,4]]", "{{template}}", "a/b\\c|d", "#$%&@^", "\"double\" 'single' `back`",
    "word.\nNext", "end.", "?!?!?!", ". . . . .", ",,,,", "''''''", "\"\"\"docstring\"\"\"",
]

POOL = (
    list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
    + list(" " * 10 + "\n\t\r'\".,;:!?-_()[]{}<>|/\\@#$%^&*+=~`")
    + ["'s", "'S", "'ll", "'LL", "'re", "'t", "'D", "'m", "'VE"]
    + ["<|eot_id|>", "<|begin_of_text|>", "<|im_start|>", "<|endoftext|>", "<s>", "</s>", "<|", "|>"]
    + list("\u00e9\u00e8\u00fc\u00f1\u00e7\u00df\u00f8\u00e5\u0142\u0111\u011f")
    + ["e\u0301", "a\u0308", "\u0301", "\u0323"]
    + list("\u4e2d\u6587\u5b57\u3042\u30a2\ud55c\uae00\u0645\u0639\u05e9\u0928\u0e2a\u0416\u03a9")
    + ["\U0001f600", "\U0001f44d\U0001f3fd", "\u200d", "\ufe0f", "\U0001f468\u200d\U0001f469"]
    + ["\u00a0", "\u3000", "\u2028", "\u0085", "\u200b", "\u2009", "\u000b", "\u000c"]
    + ["123", "4567", "\u0663", "\u00b2", "\uff15"]
)


def main():
    rng = random.Random(20240531)
    out = list(CASES)
    for _ in range(260):
        n = rng.randint(1, 40)
        out.append("".join(rng.choice(POOL) for _ in range(n)))
    # Sentences with random spacing and case, the common case in training data.
    words = ["the", "cat", "sat", "on", "mat", "It's", "DON'T", "we'll", "3", "2024", "caf\u00e9",
             "na\u00efve", "\u4e16\u754c", "co-op", "e-mail", "U.S.A.", "hello", "World"]
    for _ in range(80):
        n = rng.randint(1, 16)
        s = ""
        for _ in range(n):
            w = rng.choice(words)
            if rng.random() < 0.2:
                w = w.upper()
            s += w + rng.choice([" ", " ", " ", "  ", "\n", ", ", ". ", "\t", ""])
        out.append(s)
    for s in out:
        sys.stdout.write(json.dumps(s, ensure_ascii=True) + "\n")


if __name__ == "__main__":
    main()
