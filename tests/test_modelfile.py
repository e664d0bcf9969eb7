import re

import pytest

from plugd.store.modelfile import Modelfile, ModelfileError, parse_modelfile
from plugd.types import OPTION_TYPES


def error(text: str, filename: str = "Modelfile") -> str:
    with pytest.raises(ModelfileError) as info:
        parse_modelfile(text, filename)
    return str(info.value)


def test_every_command():
    mf = parse_modelfile(
        "FROM ./models/llama\n"
        "DRAFT qwen3:0.6b\n"
        "PARAMETER temperature 0.5\n"
        "SYSTEM You are terse.\n"
        "TEMPLATE {{ .Prompt }}\n"
        "RENDERER qwen3\n"
        "PARSER qwen3-thinking\n"
        "MESSAGE user Hi\n"
        "MESSAGE assistant Hello!\n"
        "LICENSE MIT\n"
    )
    assert mf == Modelfile(
        from_="./models/llama",
        draft="qwen3:0.6b",
        parameters={"temperature": 0.5},
        system="You are terse.",
        template="{{ .Prompt }}",
        renderer="qwen3",
        parser="qwen3-thinking",
        messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
        license=["MIT"],
    )


def test_only_from_gives_defaults():
    mf = parse_modelfile("FROM llama3.2:1b")
    assert mf == Modelfile(from_="llama3.2:1b")
    assert (mf.parameters, mf.system, mf.template, mf.renderer, mf.parser, mf.draft) == ({}, None, None, None, None, None)
    assert (mf.messages, mf.license) == ([], [])


def test_from_may_come_last():
    assert parse_modelfile("SYSTEM hi\nFROM base\n").from_ == "base"


def test_bare_arguments_are_trimmed_and_keep_inner_text():
    mf = parse_modelfile("FROM   base  \t\nSYSTEM   say \"hi\"  # not a comment  \n")
    assert mf.from_ == "base"
    assert mf.system == 'say "hi"  # not a comment'


def test_tab_separates_command_and_argument():
    assert parse_modelfile("FROM\tbase\nPARAMETER\tseed\t7").parameters == {"seed": 7}


def test_commands_are_case_insensitive():
    mf = parse_modelfile("from base\nSystem hi\ntemplate t\nReNdErEr r\nparser p\nmessage user u\nlicense l\n")
    assert (mf.from_, mf.system, mf.template, mf.renderer, mf.parser) == ("base", "hi", "t", "r", "p")
    assert mf.messages == [{"role": "user", "content": "u"}]
    assert mf.license == ["l"]


def test_comments_and_blank_lines_are_ignored():
    mf = parse_modelfile("# a comment\n\n   \n  # indented comment\n#FROM other\nFROM base\n\n# SYSTEM no\n")
    assert mf == Modelfile(from_="base")


def test_double_quoted_arguments():
    mf = parse_modelfile('FROM "./my models/llama"\nSYSTEM "  spaced  "\n')
    assert mf.from_ == "./my models/llama"
    assert mf.system == "  spaced  "


def test_double_quoted_escapes():
    mf = parse_modelfile(r'FROM base' + "\n" + r'SYSTEM "say \"hi\" \\ back\slash \n"' + "\n")
    assert mf.system == r'say "hi" \ back\slash \n'


def test_empty_double_quoted_argument():
    assert parse_modelfile('FROM base\nSYSTEM ""').system == ""


def test_triple_quoted_on_one_line():
    assert parse_modelfile('FROM base\nSYSTEM """He said "hi"."""').system == 'He said "hi".'


def test_triple_quoted_spanning_lines_is_verbatim():
    text = 'FROM base\nTEMPLATE """\n{{ if .System }}\n  # kept\n\nsys: \\"{{ .System }}\\"  \n{{ end }}"""\nSYSTEM after\n'
    mf = parse_modelfile(text)
    assert mf.template == '\n{{ if .System }}\n  # kept\n\nsys: \\"{{ .System }}\\"  \n{{ end }}'
    assert mf.system == "after"


def test_triple_quoted_content_starting_on_the_command_line():
    mf = parse_modelfile('FROM base\nSYSTEM """first\n  second\n"""\n')
    assert mf.system == "first\n  second\n"


def test_windows_line_endings():
    mf = parse_modelfile('FROM base\r\nSYSTEM """a\r\nb"""\r\nPARAMETER num_ctx 8\r\n')
    assert (mf.from_, mf.system, mf.parameters) == ("base", "a\nb", {"num_ctx": 8})


def test_later_single_valued_commands_replace_earlier_ones():
    mf = parse_modelfile("FROM b\nSYSTEM 1\nSYSTEM 2\nTEMPLATE 1\nTEMPLATE 2\nRENDERER 1\nRENDERER 2\nPARSER 1\nPARSER 2\n")
    assert (mf.system, mf.template, mf.renderer, mf.parser) == ("2", "2", "2", "2")


def test_every_license_is_kept_in_order():
    mf = parse_modelfile('FROM b\nLICENSE MIT\nLICENSE """Apache\nLicense 2.0"""\nLICENSE "third"\n')
    assert mf.license == ["MIT", "Apache\nLicense 2.0", "third"]


def test_typed_parameters():
    mf = parse_modelfile(
        "FROM b\n"
        "PARAMETER num_ctx 4096\n"
        "PARAMETER temperature 0.7\n"
        "PARAMETER top_p 1\n"
        "PARAMETER seed -3\n"
        'PARAMETER top_k "40"\n'
    )
    assert mf.parameters == {"num_ctx": 4096, "temperature": 0.7, "top_p": 1.0, "seed": -3, "top_k": 40}
    assert type(mf.parameters["num_ctx"]) is int
    assert type(mf.parameters["top_p"]) is float


@pytest.mark.parametrize("name", sorted(OPTION_TYPES))
def test_every_option_is_accepted(name):
    kind = OPTION_TYPES[name]
    value = parse_modelfile(f"FROM b\nPARAMETER {name} 2\n").parameters[name]
    assert value == (["2"] if kind is list else kind(2))


def test_later_parameter_replaces_earlier():
    assert parse_modelfile("FROM b\nPARAMETER seed 1\nPARAMETER seed 2\n").parameters == {"seed": 2}


def test_parameter_names_are_case_insensitive():
    mf = parse_modelfile("FROM b\nparameter Temperature 0.1\nPARAMETER NUM_CTX 16\nPARAMETER Stop x\n")
    assert mf.parameters == {"temperature": 0.1, "num_ctx": 16, "stop": ["x"]}


def test_repeated_stop_appends_in_order():
    mf = parse_modelfile('FROM b\nPARAMETER stop <|im_end|>\nPARAMETER stop "User:"\nPARAMETER stop """\n\n"""\n')
    assert mf.parameters == {"stop": ["<|im_end|>", "User:", "\n\n"]}


def test_quoted_parameter_value_keeps_spaces():
    assert parse_modelfile('FROM b\nPARAMETER stop " end "').parameters == {"stop": [" end "]}


def test_messages_in_order_with_quoting():
    mf = parse_modelfile(
        'FROM b\nMESSAGE system Be brief.\nMESSAGE User "Is it \\"up\\"?"\nMESSAGE ASSISTANT """Yes,\nit is."""\n'
    )
    assert mf.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": 'Is it "up"?'},
        {"role": "assistant", "content": "Yes,\nit is."},
    ]


def test_error_message_format_uses_filename_and_line():
    message = error("FROM b\n\nBOGUS x\n", filename="/tmp/x/Modelfile.dev")
    assert message == "/tmp/x/Modelfile.dev:3: unknown command 'BOGUS'"
    assert re.fullmatch(r"Modelfile:1: .+", error("FORM b"))


def test_error_is_a_value_error():
    with pytest.raises(ValueError):
        parse_modelfile("")


def test_unknown_command_counts_lines_after_a_triple_quote():
    assert error('FROM b\nSYSTEM """a\nb\n"""\nSYTSEM c\n') == "Modelfile:5: unknown command 'SYTSEM'"


def test_adapter_is_unknown():
    assert error("FROM b\nADAPTER ./lora.gguf\n") == "Modelfile:2: unknown command 'ADAPTER'"


def test_missing_from():
    assert error("") == "Modelfile:1: no FROM line"
    assert error("# nothing\nSYSTEM hi\n") == "Modelfile:1: no FROM line"


def test_second_from_is_an_error_at_its_line():
    assert error("FROM a\nSYSTEM s\nfrom b\n") == "Modelfile:3: second FROM line (the first is line 1)"


def test_second_draft_is_an_error_at_its_line():
    assert error("FROM a\nDRAFT ./small\ndraft tiny\n") == "Modelfile:3: second DRAFT line (the first is line 2)"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("FROM\n", "Modelfile:1: FROM needs an argument"),
        ("FROM b\nSYSTEM   \n", "Modelfile:2: SYSTEM needs an argument"),
        ("FROM b\n\ntemplate\n", "Modelfile:3: TEMPLATE needs an argument"),
        ("FROM b\nRENDERER\n", "Modelfile:2: RENDERER needs an argument"),
        ("FROM b\nDRAFT\n", "Modelfile:2: DRAFT needs an argument"),
        ("FROM b\nPARSER\n", "Modelfile:2: PARSER needs an argument"),
        ("FROM b\nLICENSE\n", "Modelfile:2: LICENSE needs an argument"),
        ("FROM b\nPARAMETER\n", "Modelfile:2: PARAMETER needs a name and a value"),
        ("FROM b\nPARAMETER seed   \n", "Modelfile:2: PARAMETER needs a name and a value"),
        ("FROM b\nMESSAGE user\n", "Modelfile:2: MESSAGE needs a role and content"),
        ("FROM b\nMESSAGE\n", "Modelfile:2: MESSAGE needs a role and content"),
    ],
)
def test_missing_arguments(text, message):
    assert error(text) == message


def test_unknown_parameter():
    assert error("FROM b\nPARAMETER Mirostat 1\n") == "Modelfile:2: unknown parameter 'Mirostat'"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("PARAMETER num_ctx abc", "invalid value 'abc' for parameter num_ctx: expected int"),
        ("PARAMETER NUM_CTX 2.5", "invalid value '2.5' for parameter num_ctx: expected int"),
        ("PARAMETER temperature hot", "invalid value 'hot' for parameter temperature: expected float"),
        ('PARAMETER seed ""', "invalid value '' for parameter seed: expected int"),
    ],
)
def test_bad_parameter_value(line, message):
    assert error(f"FROM b\n{line}\n") == f"Modelfile:2: {message}"


def test_bad_role():
    assert error("FROM b\nMESSAGE tool hi\n") == (
        "Modelfile:2: invalid role 'tool': expected one of system, user, assistant"
    )


def test_unterminated_triple_quote_is_reported_where_it_opened():
    assert error('FROM b\n\nSYSTEM """never\nclosed\n\n') == 'Modelfile:3: unterminated """ quote'


def test_triple_quote_closes_at_the_next_triple_quote():
    # An unclosed SYSTEM """ runs to TEMPLATE's opening quote, leaving text after the close.
    message = error('FROM b\nSYSTEM """a\nTEMPLATE """b"""\n')
    assert message == "Modelfile:3: unexpected text after closing quote: 'b\"\"\"'"


def test_unterminated_double_quote():
    assert error('FROM b\nSYSTEM "open\nSYSTEM "x"\n') == 'Modelfile:2: unterminated " quote'
    assert error('FROM b\nSYSTEM "ends in escaped quote\\"\n') == 'Modelfile:2: unterminated " quote'


def test_text_after_closing_quote():
    assert error('FROM b\nSYSTEM "a" b\n') == "Modelfile:2: unexpected text after closing quote: 'b'"
    assert error('FROM b\nSYSTEM """a\nb""" c\n') == "Modelfile:3: unexpected text after closing quote: 'c'"


def test_first_error_wins():
    assert error("BOGUS\nFROM a\nFROM b\n") == "Modelfile:1: unknown command 'BOGUS'"
