"""A hand-made four-entity world for the tool tests: Ada Moro, born in Kavo (Tesu's capital), directed Lumi,
filmed in Kavo."""

from dlmrl.envs.tools import Entity, KnowledgeBase, ToolSimulator

ENTITIES = {e.name: e for e in (Entity("Ada Moro", "person", "train"), Entity("Kavo", "city", "train"),
                                Entity("Tesu", "country", "train"), Entity("Lumi", "film", "train"))}
FACTS = {("Ada Moro", "born_in"): "Kavo", ("Kavo", "located_in"): "Tesu", ("Tesu", "capital"): "Kavo",
         ("Lumi", "directed_by"): "Ada Moro", ("Lumi", "filmed_in"): "Kavo"}
KB = KnowledgeBase(ENTITIES, FACTS)
SIM = ToolSimulator(kb=KB)
