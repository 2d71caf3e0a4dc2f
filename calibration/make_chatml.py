"""Regenerate chatml-calib.jsonl and chatml-eval.jsonl: hand-written conversations rendered with the chat template
of SmolLM2-135M-Instruct (ChatML).

Run: .venv/bin/python calibration/make_chatml.py            (writes both files; byte-identical on every run)
     .venv/bin/python calibration/make_chatml.py --check DIR (also checks that transformers' apply_chat_template
                                                              with the tokenizer in DIR gives the same text)
Each record's `text` is the whole conversation (add_generation_prompt=False); its `prompt` is the conversation
without the final assistant message, rendered with add_generation_prompt=True, so it ends with
"<|im_start|>assistant\\n" and the text starts with it. Every third conversation (index % 3 == 2) is held out for
evaluation; the conversations are all different, so the two files share no record.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from jinja2.sandbox import ImmutableSandboxedEnvironment

# SmolLM2-135M-Instruct's chat_template.jinja, verbatim.
TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n"
    "' + message['content'] + '<|im_end|>' + '\n"
    "'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n"
    "' }}{% endif %}"
)

SOURCE = (
    "written for llmkiln; rendered with SmolLM2-135M-Instruct's chat template by calibration/make_chatml.py"
)

# Each conversation: optional "system", then "turns": (user, assistant) pairs.
CONVERSATIONS: list[dict] = [
    {"turns": [("What is the boiling point of water at sea level?",
                "At sea level, water boils at 100 degrees Celsius, which is 212 degrees Fahrenheit. At higher "
                "altitudes the air pressure is lower, so water boils at a lower temperature.")]},
    {"turns": [("Can you suggest a name for a small bakery?",
                "How about \"The Rising Crumb\"? It hints at bread rising and sounds warm and friendly. Other "
                "options are \"Flour & Hearth\" or \"Morning Loaf\".")]},
    {"system": "You are a concise assistant. Answer in one sentence.",
     "turns": [("How many continents are there?",
                "There are seven continents: Africa, Antarctica, Asia, Australia, Europe, North America and South "
                "America.")]},
    {"turns": [("I want to start running. Any tips for a beginner?",
                "Start slowly with a mix of walking and running, for example one minute of running followed by two "
                "minutes of walking, for about twenty minutes. Run three times a week with rest days in between, "
                "and increase the running time gradually. Comfortable shoes that fit well matter more than any "
                "other gear."),
               ("How long until I can run 5 km without stopping?",
                "Many beginners who follow a structured plan can run 5 km without stopping after about eight or "
                "nine weeks. It varies from person to person, so listen to your body and repeat a week if it feels "
                "too hard.")]},
    {"turns": [("Translate 'good morning' into Spanish.",
                "\"Good morning\" in Spanish is \"buenos días\".")]},
    {"turns": [("What does CPU stand for?",
                "CPU stands for central processing unit. It is the main chip in a computer that carries out the "
                "instructions of programs.")]},
    {"system": "You are a helpful cooking assistant.",
     "turns": [("What can I use instead of eggs in muffins?",
                "For each egg, you can use a quarter cup of mashed banana or unsweetened applesauce, or one "
                "tablespoon of ground flaxseed mixed with three tablespoons of water and left to thicken for five "
                "minutes. All of these work well in muffins, though banana will add some flavour.")]},
    {"turns": [("How do I reverse a list in Python?",
                "You can use slicing: `reversed_list = my_list[::-1]` creates a new, reversed list. If you want to "
                "reverse the list in place, call `my_list.reverse()`."),
               ("Which one is faster?",
                "`my_list.reverse()` is usually a little faster and uses less memory, because it does not create a "
                "new list. Use slicing when you also need to keep the original order.")]},
    {"turns": [("Why do cats purr?",
                "Cats often purr when they are relaxed and content, but they also purr when they are stressed, "
                "injured or giving birth. Scientists think purring can be a way to communicate and to soothe "
                "themselves.")]},
    {"turns": [("Write a haiku about autumn.",
                "Crisp leaves drift and fall,\ngolden light on quiet paths,\nthe year breathes out slow.")]},
    {"turns": [("What's the difference between weather and climate?",
                "Weather is the state of the atmosphere at a particular time and place, such as today's rain or "
                "sunshine. Climate is the average pattern of weather in a region over many years, usually thirty "
                "or more.")]},
    {"system": "You are a friendly tutor for children.",
     "turns": [("What is a fraction?",
                "A fraction shows a part of something whole. If you cut a pizza into four equal slices and eat "
                "one, you have eaten one quarter, which is written 1/4."),
               ("Which is bigger, 1/2 or 1/3?",
                "One half is bigger. If you share a pizza between two people, each person gets more than if you "
                "share it between three people.")]},
    {"turns": [("How many minutes are in a day?",
                "There are 1,440 minutes in a day, because 24 hours times 60 minutes equals 1,440.")]},
    {"turns": [("Give me three tips to save electricity at home.",
                "Switch to LED bulbs, which use far less energy than old incandescent ones. Turn devices off at "
                "the wall instead of leaving them on standby. Wash clothes at lower temperatures, and only run the "
                "washing machine or dishwasher when it is full.")]},
    {"turns": [("Who wrote Pride and Prejudice?",
                "Pride and Prejudice was written by Jane Austen and first published in 1813.")]},
    {"turns": [("I have a job interview tomorrow and I'm nervous.",
                "Feeling nervous is completely normal, and it shows that you care. Prepare short answers to common "
                "questions, such as why you want the job and an example of a problem you solved, and say them out "
                "loud a few times. Plan your route and clothes tonight so the morning is calm."),
               ("What should I ask them at the end?",
                "Good questions include what a typical day in the role looks like, how success will be measured "
                "in the first few months, and what the team is like. Asking about the next steps in the hiring "
                "process is also fine.")]},
    {"turns": [("What is the largest planet in our solar system?",
                "Jupiter is the largest planet in our solar system. It is a gas giant with more than twice the mass "
                "of all the other planets combined.")]},
    {"system": "Answer as briefly as possible.",
     "turns": [("What is 15% of 80?", "15% of 80 is 12.")]},
    {"turns": [("How do I make my sourdough starter more active?",
                "Feed it regularly, for example once or twice a day with equal weights of flour and water, and "
                "keep it somewhere warm, around 24 to 27 degrees Celsius. Adding a little wholemeal or rye flour "
                "can also give it a boost, since those flours carry more nutrients for the yeast and bacteria.")]},
    {"turns": [("What's a good houseplant for a dark room?",
                "A snake plant or a ZZ plant is a good choice. Both tolerate low light and only need watering "
                "every few weeks."),
               ("Are they safe for cats?",
                "Not entirely: both snake plants and ZZ plants can upset a cat's stomach if chewed. If you have "
                "cats, a parlour palm or a cast-iron plant is a safer low-light option."),
               ("Thanks, I'll get a parlour palm.",
                "Good choice. Keep it out of direct sun and water it when the top few centimetres of soil feel "
                "dry.")]},
    {"turns": [("Explain what an atom is in simple words.",
                "An atom is the tiniest building block of ordinary matter. It has a small centre called the "
                "nucleus, made of protons and neutrons, with even smaller electrons moving around it. Everything "
                "you can touch, from water to your own body, is made of atoms.")]},
    {"turns": [("Is it safe to look at the sun during an eclipse?",
                "No, looking directly at the sun during a partial eclipse can permanently damage your eyes. Use "
                "certified eclipse glasses or a simple pinhole projector instead. Only during the brief totality "
                "of a total eclipse is it safe to look without protection.")]},
    {"system": "You are a helpful assistant that writes polite emails.",
     "turns": [("Write a short email asking my manager for Friday off.",
                "Subject: Leave request for Friday\n\nHi Sarah,\n\nI would like to request a day of annual leave "
                "this Friday. My current tasks are on track, and I will hand over anything urgent before then. "
                "Please let me know if that works for you.\n\nThanks,\nAlex")]},
    {"turns": [("What is the capital of Australia?", "The capital of Australia is Canberra."),
               ("Why not Sydney?",
                "When Australia's colonies federated in 1901, Sydney and Melbourne both wanted to be the capital. "
                "As a compromise, a new city, Canberra, was built between them, and Parliament moved there in "
                "1927.")]},
    {"turns": [("How long should I boil pasta?",
                "Most dried pasta takes between 8 and 12 minutes in well-salted boiling water; check the packet for "
                "the exact time. Taste a piece a minute before the suggested time, and drain it when it is tender "
                "but still slightly firm in the centre.")]},
    {"turns": [("What's the plural of 'cactus'?",
                "Both \"cacti\" and \"cactuses\" are correct. \"Cacti\" is more common, especially in scientific "
                "writing.")]},
    {"turns": [("Can you help me plan a weekly workout?",
                "Sure. A balanced week could include three days of strength training, such as Monday, Wednesday "
                "and Friday, two days of cardio like brisk walking or cycling, and two rest days. How much time do "
                "you have for each session?"),
               ("About 30 minutes.",
                "Thirty minutes is plenty. On strength days, do three rounds of bodyweight exercises such as "
                "squats, push-ups and lunges, and on cardio days keep a steady pace at which you can still talk "
                "but feel slightly out of breath.")]},
    {"turns": [("What causes rainbows?",
                "A rainbow appears when sunlight enters raindrops, bends, reflects off the back of each drop and "
                "bends again as it leaves. Because each colour bends by a slightly different amount, the white "
                "light spreads out into a band of colours. You see a rainbow when the sun is behind you and rain "
                "is in front of you.")]},
    {"system": "You are SmolLM, a friendly assistant. Keep answers short.",
     "turns": [("Hi! Who are you?",
                "Hi! I'm SmolLM, a small AI assistant. I can answer questions, help with writing and explain "
                "things. What would you like to talk about?")]},
    {"turns": [("Convert 5 kilometres to miles.",
                "5 kilometres is about 3.11 miles, since one kilometre is roughly 0.621 miles.")]},
    {"turns": [("What is the difference between 'affect' and 'effect'?",
                "\"Affect\" is usually a verb meaning to influence something, as in \"The rain affected the "
                "match.\" \"Effect\" is usually a noun meaning a result, as in \"The rain had a big effect on the "
                "match.\"")]},
    {"system": "You are a helpful assistant for travellers.",
     "turns": [("I'm visiting Japan next month. Do I need cash?",
                "Yes, it is a good idea to carry some cash. Cards are widely accepted in cities, but many small "
                "restaurants, shrines and rural shops still prefer cash. ATMs in convenience stores such as "
                "7-Eleven usually accept foreign cards."),
               ("What about tipping?",
                "Tipping is not customary in Japan and can even cause confusion. Good service is expected as "
                "standard, so a simple thank you is enough.")]},
    {"turns": [("Why is the ocean salty?",
                "Rain slowly wears down rocks on land and carries dissolved minerals, including salts, through "
                "rivers into the sea. When seawater evaporates, the water leaves but the salt stays behind, so over "
                "millions of years the salt has built up. Vents on the sea floor add minerals too.")]},
    {"turns": [("Recommend a good way to learn a new language.",
                "Practise a little every day rather than a lot once a week, since regular short sessions build "
                "memory better. Combine a course or app for vocabulary and grammar with real listening, such as "
                "podcasts or films with subtitles. Speaking with a native speaker or tutor, even for a few "
                "minutes, builds confidence much faster.")]},
    {"turns": [("My code says 'IndexError: list index out of range'. What does that mean?",
                "It means your code tried to access a position in a list that does not exist. For example, a list "
                "with three items has the indexes 0, 1 and 2, so asking for index 3 raises this error."),
               ("How can I avoid it?",
                "Check the length of the list with `len()` before using an index, or loop directly over the items "
                "with `for item in my_list:` instead of using indexes. If you need the index as well, "
                "`enumerate(my_list)` gives you both safely.")]},
    {"turns": [("What year did World War II end?",
                "World War II ended in 1945. Germany surrendered in May, and Japan surrendered in August, with the "
                "formal signing on 2 September 1945.")]},
    {"system": "You are a patient assistant who explains things step by step.",
     "turns": [("How do I calculate the area of a circle?",
                "First, find the radius, the distance from the centre to the edge. Then multiply the radius by "
                "itself. Finally, multiply that result by pi, about 3.14, so a circle with a radius of 2 cm has an "
                "area of about 12.57 square centimetres.")]},
    {"turns": [("Give me a fun fact about sloths.",
                "Sloths move so slowly that algae grow in their fur, giving them a greenish tint that helps them "
                "hide in the trees. They usually climb down to the ground only about once a week, to go to the "
                "toilet.")]},
    {"turns": [("What's a healthy breakfast I can make in five minutes?",
                "Try a bowl of Greek yogurt topped with fresh berries, a handful of oats or nuts and a drizzle of "
                "honey. It gives you protein, fibre and some natural sweetness with no cooking."),
               ("I don't like yogurt.",
                "No problem. A slice of wholegrain toast with peanut butter and a sliced banana is just as quick, "
                "or you could make a bowl of porridge with milk in the microwave in about two minutes.")]},
    {"turns": [("What's the tallest mountain in the world?",
                "Mount Everest is the tallest mountain above sea level, at 8,849 metres. Measured from base to "
                "peak, however, Mauna Kea in Hawaii is taller, since most of it lies under the ocean.")]},
    {"turns": [("How do I politely decline an invitation?",
                "Thank the person first, then decline clearly and briefly, for example: \"Thank you so much for "
                "inviting me, but I won't be able to make it this time.\" If you would like to see them another "
                "time, you can suggest an alternative.")]},
    {"system": "You are a helpful assistant.",
     "turns": [("What is a leap year?",
                "A leap year has 366 days instead of 365, with an extra day added on 29 February. It keeps the "
                "calendar in step with the Earth's orbit, which takes about 365.24 days."),
               ("Is 2100 a leap year?",
                "No. Years divisible by 100 are not leap years unless they are also divisible by 400, so 2000 was "
                "a leap year but 2100 will not be."),
               ("And 2024?", "Yes, 2024 is a leap year, because it is divisible by 4 and not by 100.")]},
    {"turns": [("What is the chemical symbol for gold?",
                "The chemical symbol for gold is Au, from its Latin name, aurum.")]},
    {"turns": [("Summarise the story of Romeo and Juliet in two sentences.",
                "Romeo and Juliet, two young people from feuding families in Verona, fall in love and marry in "
                "secret. A chain of misunderstandings leads Romeo to believe that Juliet is dead, and both take "
                "their own lives, which finally reconciles their families.")]},
    {"turns": [("How often should I water a cactus?",
                "In spring and summer, water a cactus thoroughly about every two to three weeks, letting the soil "
                "dry out completely in between. In winter, when it rests, once a month or even less is usually "
                "enough."),
               ("Should I use a normal pot?",
                "Use a pot with a drainage hole and a gritty cactus compost, so that water never sits around the "
                "roots. Terracotta pots are a good choice because they help the soil dry faster.")]},
    {"turns": [("What does HTTP stand for?",
                "HTTP stands for Hypertext Transfer Protocol. It is the set of rules that web browsers and servers "
                "use to exchange web pages and other data.")]},
    {"system": "You are an assistant that always replies in French.",
     "turns": [("How do you say 'thank you very much'?", "On dit « merci beaucoup ».")]},
    {"turns": [("I keep forgetting to drink water. Any ideas?",
                "Keep a refillable bottle on your desk or in your bag, since having water in sight is a strong "
                "reminder. You could also link drinking to routines, such as a glass with every meal and one after "
                "brushing your teeth."),
               ("What about an app?",
                "That can help too. Many free habit or water-tracking apps send gentle reminders during the day, "
                "and most phones let you set repeating reminders without installing anything.")]},
]  # fmt: skip


def messages(conv: dict) -> list[dict[str, str]]:
    out = [{"role": "system", "content": conv["system"]}] if conv.get("system") else []
    for user, assistant in conv["turns"]:
        out += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return out


def render(msgs: list[dict[str, str]], add_generation_prompt: bool) -> str:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(TEMPLATE).render(messages=msgs, add_generation_prompt=add_generation_prompt)


def records() -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {"calib": [], "eval": []}
    for i, conv in enumerate(CONVERSATIONS):
        msgs = messages(conv)
        text = render(msgs, add_generation_prompt=False)
        prompt = render(msgs[:-1], add_generation_prompt=True)
        assert text.startswith(prompt) and prompt.endswith("<|im_start|>assistant\n"), i
        split = "eval" if i % 3 == 2 else "calib"
        rows = out[split]
        rows.append(
            {"id": f"chatml-{split}-{len(rows):04d}", "prompt": prompt, "text": text, "source": SOURCE}
        )
    return out


def check_against_transformers(model_dir: str) -> None:
    """The rendered text must equal transformers' apply_chat_template with the model's own tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    for i, conv in enumerate(CONVERSATIONS):
        msgs = messages(conv)
        for m, gen in ((msgs, False), (msgs[:-1], True)):
            ref = tok.apply_chat_template(m, tokenize=False, add_generation_prompt=gen)
            assert ref == render(m, gen), f"conversation {i}: template mismatch (add_generation_prompt={gen})"
    print(f"{len(CONVERSATIONS)} conversations: identical to apply_chat_template of {model_dir}")


def main() -> None:
    here = Path(__file__).parent
    for split, rows in records().items():
        (here / f"chatml-{split}.jsonl").write_text(
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8"
        )
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        check_against_transformers(sys.argv[2])


if __name__ == "__main__":
    main()
