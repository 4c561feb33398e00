"""Realistic model replies per mode (well-formed, sloppy, broken, hostile) and what each parses to.

An expected value is an action; ``More(action, n)`` when the reply holds n further
actions the note must mention; or ``Err(kind, words...)`` for a ParseError of that
kind whose message contains every word. Replies are parsed with the default
policy (127.0.0.1 and localhost) on the page ``BASE``.
"""

from dataclasses import dataclass

from rollout.agent.actions import (
    Answer,
    Back,
    Click,
    ExtractText,
    Fill,
    Goto,
    Screenshot,
    Scroll,
    Search,
    SomClick,
    SomScroll,
    SomType,
    Visit,
)

BASE = "http://127.0.0.1:8900/wiki/Start"
SITE = "http://127.0.0.1:8900"


@dataclass(frozen=True)
class Err:
    kind: str
    words: tuple[str, ...] = ()


def err(kind, *words):
    return Err(kind, words)


@dataclass(frozen=True)
class More:
    action: object
    more: int


API = [
    # well-formed
    ("<action>search</action><query>2024 US GDP</query>", Search("2024 US GDP")),
    (f"<action>visit</action><url>{SITE}/wiki/Python</url>", Visit(f"{SITE}/wiki/Python")),
    ("<action>answer</action><answer>Paris</answer>", Answer("Paris")),
    ("<search>capital of France</search>", Search("capital of France")),
    ("<visit>http://localhost:8900/a</visit>", Visit("http://localhost:8900/a")),
    ("<answer>1889</answer>", Answer("1889")),
    (
        "I need the GDP first.\n<action>search</action>\n<query>US GDP 2024</query>",
        Search("US GDP 2024"),
    ),
    (
        "<think>It says 1889. Maybe <search>more</search>?</think>\n<answer>1889</answer>",
        Answer("1889"),
    ),
    (
        "<think>I need to search.</think>\n<search> who wrote Hamlet </search>",
        Search("who wrote Hamlet"),
    ),
    ("So the answer is clear.</think><answer>Shakespeare</answer>", Answer("Shakespeare")),
    ("<think></think><answer>42</answer>", Answer("42")),
    ("<thinking>hmm</thinking><search>q</search>", Search("q")),
    ("<answer>It is <b>Paris</b></answer>", Answer("It is <b>Paris</b>")),
    (
        f"<answer>1889\n[1] {SITE}/wiki/Eiffel_Tower</answer>",
        Answer(f"1889\n[1] {SITE}/wiki/Eiffel_Tower"),
    ),
    ("<search>AT&T founding year</search>", Search("AT&T founding year")),
    ("<search>x < y in Python</search>", Search("x < y in Python")),
    ("<search>'; DROP TABLE tasks; --</search>", Search("'; DROP TABLE tasks; --")),
    (
        "<answer>__import__('os').system('rm -rf /')</answer>",
        Answer("__import__('os').system('rm -rf /')"),
    ),
    ('Here is my plan: {"step": 1}\n<search>q</search>', Search("q")),
    # sloppy: case, whitespace, fences, missing closing tags, smart quotes
    ("<ACTION>SEARCH</ACTION><QUERY>Eiffel tower height</QUERY>", Search("Eiffel tower height")),
    ("<Action> Visit </Action><Url> http://127.0.0.1:8900/x </Url>", Visit(f"{SITE}/x")),
    ("< action >search</ action ><query>x</query>", Search("x")),
    ("<action>\nanswer\n</action>\n<answer>\nParis\n</answer>", Answer("Paris")),
    ("\t<search>\tq\t</search>", Search("q")),
    ("<action>answer</action><answer>The Eiffel Tower", Answer("The Eiffel Tower")),
    ("<search>python release date", Search("python release date")),
    ("<action>search<query>x</query>", Search("x")),
    ("```xml\n<action>search</action><query>x y</query>\n```", Search("x y")),
    ("```\n<search>q</search>\n```", Search("q")),
    ("<search>“Eiffel Tower” height</search>", Search("“Eiffel Tower” height")),
    ("<visit>HTTP://LOCALHOST/x</visit>", Visit("http://localhost/x")),
    ("<visit>/wiki/Paris</visit>", Visit(f"{SITE}/wiki/Paris")),
    ("<visit>http://LOCALHOST.:8900/a</visit>", Visit("http://localhost:8900/a")),
    ("<visit>http://127.0.0.1:8900#@evil.com</visit>", Visit(f"{SITE}/#@evil.com")),
    ("\x00\x01<search>q</search>", Search("q")),
    # several actions: the first runs, the note counts the rest
    ("<search>a</search>\n<search>b</search>", More(Search("a"), 1)),
    (
        "<action>search</action><query>a</query><action>visit</action><url>http://localhost/</url>",
        More(Search("a"), 1),
    ),
    (
        "<search>a</search><visit>http://localhost/</visit><answer>x</answer>",
        More(Search("a"), 2),
    ),
    (
        "<action>answer</action><answer>Paris</answer><answer>Lyon</answer>",
        More(Answer("Paris"), 1),
    ),
    # broken
    ("", err("no_action", "No action found", "<action>search</action>")),
    ("I think the answer is Paris.", err("no_action", "search, visit, answer")),
    ('search("x")', err("no_action", "<action>search</action><query>")),
    ("<<<<>>>>", err("no_action")),
    ("</search>", err("no_action")),
    ("<think>I should use <search>x</search>", err("no_action", "ended inside <think>")),
    (
        "<action>click</action><selector>#a</selector>",
        err("unknown_action", '"click"', "search, visit, answer"),
    ),
    ("<action>serach</action><query>x</query>", err("unknown_action", 'Did you mean "search"')),
    ("<action></action><query>x</query>", err("unknown_action", "empty")),
    ('<tool_call>{"name": "search"}</tool_call>', err("unknown_action", '"tool_call"')),
    ("<click>#a</click>", err("unknown_action", '"click"')),
    ("<action>search</action>", err("missing_argument", '"query"', "<query>2024 US GDP</query>")),
    ("<action>search</action><q>x</q>", err("missing_argument", '"query"')),
    ("<action>answer</action>", err("missing_argument", '"text"', "<answer>Paris</answer>")),
    ("<query>x</query>", err("no_action", "without an <action>")),
    ("<search></search>", err("bad_argument", "non-empty")),
    ("<answer>   </answer>", err("bad_argument", "non-empty")),
    ("x" * 300_000, err("too_long", "300000")),
    # hostile URLs
    ("<visit>javascript:alert(1)</visit>", err("refused_url", "'javascript'")),
    ("<visit>JavaScript:alert(document.cookie)</visit>", err("refused_url", "'javascript'")),
    ("<visit>file:///etc/passwd</visit>", err("refused_url", "'file'")),
    ("<visit>http://evil.com/</visit>", err("refused_url", "evil.com", "127.0.0.1")),
    ("<visit>http://localhost@evil.com/</visit>", err("refused_url", "evil.com")),
    ("<visit>//evil.com/x</visit>", err("refused_url", "no scheme")),
    ("<visit>data:text/html,hi</visit>", err("refused_url", "'data'")),
    ("<action>visit</action><url>chrome://settings</url>", err("refused_url", "'chrome'")),
    ("<visit>www.google.com</visit>", err("refused_url", "not a URL")),
    ("<visit>http://127.0.0.1:8900\\@evil.com/</visit>", err("refused_url", "backslash")),
    ("<visit>http://[::1]:8900/</visit>", err("refused_url", "[::1]")),
    ("<visit>http://%65vil.com/</visit>", err("refused_url", "evil.com")),
]

PLAYWRIGHT = [
    # well-formed
    (f'goto("{SITE}/wiki/Python")', Goto(f"{SITE}/wiki/Python")),
    ('click("#next")', Click("#next")),
    ('fill("input[name=q]", "2024 US GDP")', Fill("input[name=q]", "2024 US GDP")),
    ("scroll(0, 600)", Scroll(0, 600)),
    ("back()", Back()),
    ('extract_text("main")', ExtractText("main")),
    ("screenshot()", Screenshot()),
    ('answer("Paris")', Answer("Paris")),
    ('click(selector="#next")', Click("#next")),
    ('fill(selector="#q", value="x")', Fill("#q", "x")),
    ('fill("#q", value="x")', Fill("#q", "x")),
    ("scroll(dx=0, dy=-400)", Scroll(0, -400)),
    ("scroll(dy=300, dx=0)", Scroll(0, 300)),
    ('answer(text="Paris")', Answer("Paris")),
    ('fill("#q", "")', Fill("#q", "")),
    ('answer("Paris " "France")', Answer("Paris France")),
    (f'answer("1889\\n[1] {SITE}/wiki/Eiffel")', Answer(f"1889\n[1] {SITE}/wiki/Eiffel")),
    ('answer("""Line one\nLine two""")', Answer("Line one\nLine two")),
    ('click("text=Sign (in)")', Click("text=Sign (in)")),
    # sloppy
    ('```python\nclick("text=Next page")\n```', Click("text=Next page")),
    (
        "I'll open the page.\n```python\ngoto('http://localhost:8900/')\n```",
        Goto("http://localhost:8900/"),
    ),
    ('await page.click("#submit")', Click("#submit")),
    (f'page.goto("{SITE}/a")', Goto(f"{SITE}/a")),
    ("click('#a')", Click("#a")),
    ("click(“#a”)", Click("#a")),
    ("extract_text(‘main’)", ExtractText("main")),
    ('CLICK("#a")', Click("#a")),
    ("Click ('#a')", Click("#a")),
    ('answer("Paris"', Answer("Paris")),
    ("scroll(0, 600", Scroll(0, 600)),
    ('<think>maybe goto("http://evil.com")</think>\nclick("#a")', Click("#a")),
    ("Using click() here would fail.\n```python\nback()\n```", Back()),
    ('I will click (the first result) now: click("a.result")', Click("a.result")),
    ('fill("#year", 2024)', Fill("#year", "2024")),
    ("scroll(0, 600.0)", Scroll(0, 600)),
    ('scroll("0", "600")', Scroll(0, 600)),
    ('goto("/wiki/Paris")', Goto(f"{SITE}/wiki/Paris")),
    ('goto("HTTP://LOCALHOST:8900/")', Goto("http://localhost:8900/")),
    ('click("#a");  # go', Click("#a")),
    ("Action: back()", Back()),
    ('```py\nawait page.fill("#q", "GDP")', Fill("#q", "GDP")),
    ('```python\nclick("#a"\n```\nDone.', Click("#a")),  # ) missing at the fence's end
    # several actions
    ('click("#a")\nclick("#b")', More(Click("#a"), 1)),
    ('```python\nfill("#q", "x")\nclick("#go")\n```', More(Fill("#q", "x"), 1)),
    ('answer("see click(\\"#x\\")")', Answer('see click("#x")')),  # a call inside a string
    # broken
    ("", err("no_action", 'goto("http://127.0.0.1:8900/wiki/Python")')),
    ("I don't know what to do.", err("no_action", "extract_text")),
    ("<action>goto</action><url>http://localhost/</url>", err("no_action")),
    ('"' * 1000, err("no_action")),
    ('navigate("http://x")', err("unknown_action", '"navigate"', "goto, click, fill")),
    ('type("#q", "x")', err("unknown_action", '"type"')),
    ('clik("#a")', err("unknown_action", 'Did you mean "click"')),
    ('__import__("os").system("rm -rf /")', err("unknown_action", '"__import__"')),
    ('eval("1+1")', err("unknown_action", '"eval"')),
    ('os.system("ls")', err("unknown_action", '"system"')),
    ("click()", err("missing_argument", '"selector"', 'click("#next")')),
    ('fill("#q")', err("missing_argument", '"value"')),
    ('click("#a", "#b")', err("extra_argument", "takes 1 argument (selector) but got 2")),
    ('click(sel="#a")', err("extra_argument", 'no argument "sel"')),
    ('click("#a", selector="#b")', err("extra_argument", "twice")),
    ("screenshot(True)", err("extra_argument", "takes 0 arguments")),
    ("click(selector)", err("bad_argument", "string in quotes", "selector")),
    ("click(get_selector())", err("bad_argument", "get_selector()")),
    ('click(f"#{x}")', err("bad_argument", "string in quotes")),
    ("click(lambda: 1)", err("bad_argument")),
    ('scroll("down")', err("bad_argument", "whole number", "scroll(0, 600)")),
    ("scroll(0, True)", err("bad_argument", "whole number")),
    ("scroll(0, 10**100)", err("bad_argument", "whole number")),
    ("scroll(0, 99999999999)", err("bad_argument", "whole number")),
    ("click(*args)", err("syntax", "*args")),
    ('answer("Paris', err("syntax", "not closed")),
    ('click(["#a")', err("syntax", "invalid syntax")),
    ("click(" + "(" * 300, err("syntax")),
    # hostile URLs
    ('goto("javascript:alert(document.cookie)")', err("refused_url", "'javascript'")),
    ('goto("file:///etc/passwd")', err("refused_url", "'file'")),
    ('goto("http://evil.com/steal")', err("refused_url", "evil.com")),
    ('goto("http://localhost:8900@evil.com/")', err("refused_url", "evil.com")),
    ('goto("view-source:http://localhost/")', err("refused_url", "'view-source'")),
    ('goto("about:blank")', err("refused_url", "'about'")),
]

SOM = [
    # well-formed
    ("click(3)", SomClick(3)),
    ("click [3]", SomClick(3)),
    ("click[12]", SomClick(12)),
    ('type(5, "2024 US GDP")', SomType(5, "2024 US GDP")),
    ('type [5] "2024 US GDP"', SomType(5, "2024 US GDP")),
    ("scroll(down)", SomScroll("down")),
    ('scroll("down")', SomScroll("down")),
    ("back()", Back()),
    (f'goto("{SITE}/wiki/Python")', Goto(f"{SITE}/wiki/Python")),
    ('answer("Paris")', Answer("Paris")),
    ("click(n=4)", SomClick(4)),
    ('type(n=5, text="x")', SomType(5, "x")),
    ("scroll(direction='up')", SomScroll("up")),
    ('type(5, "")', SomType(5, "")),
    (
        f'answer("Finished in 1889.\\n[1] {SITE}/wiki/Eiffel_Tower")',
        Answer(f"Finished in 1889.\n[1] {SITE}/wiki/Eiffel_Tower"),
    ),
    # sloppy
    ("CLICK [7]", SomClick(7)),
    ("click( 3 )", SomClick(3)),
    ("click [ 3 ]", SomClick(3)),
    ('click("5")', SomClick(5)),
    ('click("[5]")', SomClick(5)),
    ("click([5])", SomClick(5)),
    ("type [5] [2024 US GDP]", SomType(5, "2024 US GDP")),
    ("type [5] 2024 US GDP", SomType(5, "2024 US GDP")),
    ("type [5] 'single'", SomType(5, "single")),
    ('type [5] "say \\"hi\\""', SomType(5, 'say "hi"')),
    ("type [5] [hello] ", SomType(5, "hello")),
    ("scroll('UP')", SomScroll("up")),
    ("scroll [down]", SomScroll("down")),
    ("SCROLL(Down)", SomScroll("down")),
    (f"goto [{SITE}/wiki/Python]", Goto(f"{SITE}/wiki/Python")),
    ('goto("/wiki/Paris")', Goto(f"{SITE}/wiki/Paris")),
    (f"goto [{SITE}#@evil.com]", Goto(f"{SITE}/#@evil.com")),
    ("answer [Paris]", Answer("Paris")),
    ('The search box is [5]. type [5] "GDP"', SomType(5, "GDP")),
    ("I'll click on the link labelled [3].\nclick [3]", SomClick(3)),
    ("```\nclick(3)\n```", SomClick(3)),
    ("type(5, “GDP”)", SomType(5, "GDP")),
    ("<think>click(1)?</think>click(2)", SomClick(2)),
    ("click(3", SomClick(3)),
    ("Action: click [3]", SomClick(3)),
    # several actions
    ("click [3]\nclick [4]", More(SomClick(3), 1)),
    ('click(3) then type(4, "x")', More(SomClick(3), 1)),
    # broken
    ("", err("no_action", "click(3)")),
    ("Let me look at the page.", err("no_action", "click, type, scroll")),
    ("\x00\xff\ufffd", err("no_action")),
    ("<think>I will click [3]", err("no_action", "inside <think>")),
    (
        "hover [3]",
        err(
            "unknown_action", '"hover"', "click, type, scroll, back, forward, observe, goto, answer"
        ),
    ),
    ('fill(5, "x")', err("unknown_action", '"fill"')),
    ("stop [Paris]", err("unknown_action", '"stop"')),
    ('click("#submit")', err("bad_argument", "whole number", "click(3)")),
    ("click(three)", err("bad_argument", "whole number", "three")),
    ("click [ ]", err("bad_argument", "whole number")),
    ("click(99999999999)", err("bad_argument", "whole number")),
    ("click()", err("missing_argument", '"n"')),
    ("type(5)", err("missing_argument", '"text"', 'type(5, "2024 US GDP")')),
    ("type [5]", err("missing_argument", '"text"')),
    ("scroll(left)", err("bad_argument", "up, down", "left")),
    ("scroll(3)", err("bad_argument", "up, down")),
    ("scroll()", err("missing_argument", '"direction"')),
    ("click(3, 4)", err("extra_argument", "takes 1 argument")),
    ("answer()", err("missing_argument", '"text"')),
    ('answer("")', err("bad_argument", "non-empty")),
    ("click [3", err("syntax", "not closed")),
    ('type [5] "unclosed', err("syntax", "not closed")),
    ("click(" + "(" * 500, err("syntax")),
    # hostile URLs
    ('goto("javascript:alert(1)")', err("refused_url", "'javascript'")),
    ("goto [file:///etc/passwd]", err("refused_url", "'file'")),
    ('goto("http://evil.com")', err("refused_url", "evil.com")),
    ('goto("//evil.com")', err("refused_url", "no scheme")),
    ('goto("blob:http://localhost/x")', err("refused_url", "'blob'")),
]

CORPUS = {"api": API, "playwright": PLAYWRIGHT, "som": SOM}
